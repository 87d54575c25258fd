# recipe mcdbg, point 0 (mooncake: tp=1 dp=1 ep=1 dp_attention=false; conc 16 32)
# image -, vLLM 0.24
# DRAM budget for the mooncake KV tier (MiB = 2^20 B, GB = 1e9 B, GiB = 2^30 B):
#   host DRAM: 81,920 MiB (cap 2,861,022 MiB); from the recipe's kv_offload.host_dram_mib
#   budget: 81,920 MiB x 2^20 B/MiB x 0.8 x 1/1 GPUs = 68.719 GB -> 68 GB (GB = 1e9 bytes)
#   in GiB: 68 GB x 1e9 / 2^30 = 63.33 -> 63 GiB (GiB = 2^30 bytes)
#   per rank: (63 GiB - 0 GiB checkpoint page cache) // 1 ranks - 4 GiB local buffer = 59 GiB
#   global_segment_size "59GB" (vLLM's Mooncake config reads GB as 2^30 bytes: 63,350,767,616 bytes)
#   held in steady state: x 0.76 (mooncake_master evicts 10% of its keys each time it passes 80% full, so it holds between 72% and 80%): the size the cache theory uses
cat > /tmp/w/ab/server-b/mooncake_config.json <<'EOF'
{
  "mode": "embedded",
  "metadata_server": "P2PHANDSHAKE",
  "master_server_address": "127.0.0.1:50277",
  "global_segment_size": "59GB",
  "local_buffer_size": "4GB",
  "protocol": "tcp",
  "device_name": "",
  "enable_offload": false
}
EOF
mooncake_master --port 50277 --eviction_high_watermark_ratio=0.80 --eviction_ratio=0.10 &
export VLLM_LOGGING_CONFIG_PATH=/tmp/recipes/vlog.json
export MOONCAKE_CONFIG_PATH=/tmp/w/ab/server-b/mooncake_config.json
export PYTHONHASHSEED=0
python3 -m vllm.entrypoints.openai.api_server --model /tmp/q3/model --served-model-name qwen3-8b-dummy --host 127.0.0.1 --port 38277 --tensor-parallel-size 1 --load-format dummy --gpu-memory-utilization 0.85 --max-model-len 131072 --default-chat-template-kwargs '{"enable_thinking":true}' --kv-transfer-config '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both","kv_connector_extra_config":{"load_async":true}}' --enable-prompt-tokens-details --num-gpu-blocks-override 12288
