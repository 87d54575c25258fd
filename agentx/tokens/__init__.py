"""The token vocabulary the client and the simulator share: the built-in tokenizer (and the
Hugging Face wrapper with the same interface) and the word list synthetic prompts are written in.
Both sides import it; neither imports the other (tests/test_layers.py)."""
