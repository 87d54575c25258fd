# recipe offb, point 0 (simple-cpu: tp=1 dp=1 ep=1 dp_attention=false; conc 16 32)
# image -, vLLM 0.24
export VLLM_USE_SIMPLE_KV_OFFLOAD=1
python3 -m vllm.entrypoints.openai.api_server --model /tmp/q3/model --served-model-name qwen3-8b-dummy --host 127.0.0.1 --port 8000 --tensor-parallel-size 1 --load-format dummy --gpu-memory-utilization 0.85 --max-model-len 131072 --default-chat-template-kwargs '{"enable_thinking":true}' --kv-transfer-config '{"kv_connector":"SimpleCPUOffloadConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":64424509440,"lazy_offload":true}}' --enable-prompt-tokens-details --num-gpu-blocks-override 12288
