# recipe cap, point 0 (capped: tp=1 dp=1 ep=1 dp_attention=false; conc 16 32)
# image -, vLLM 0.24
python3 -m vllm.entrypoints.openai.api_server --model /tmp/q3/model --served-model-name qwen3-8b-dummy --host 127.0.0.1 --port 8000 --tensor-parallel-size 1 --load-format dummy --gpu-memory-utilization 0.85 --max-model-len 131072 --default-chat-template-kwargs '{"enable_thinking":true}' --enable-prompt-tokens-details --num-gpu-blocks-override 12288
