set -u
B=device-bin; export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
. bench/wgpu/vulkan_env.sh >/dev/null
cat README.md README.md README.md > /tmp/prompt.txt
$B/ds4-gguf synth flash:6 /dev/shm/flash6.gguf --mix q2 2>&1 | tail -1
for c in 1 8; do
  DS4_CUDA_PROFILE=1 timeout 120 $B/ds4-bench -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens 16 --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $c > $OUT/cuda_prof_$c.log 2>&1
  timeout 120 $B/ds4-bench -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens 64 --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $c 2>/dev/null | grep "^4096" | tee -a $OUT/flash6_batch.csv
done
DS4_WGPU_PROFILE=1 timeout 150 $B/old/ds4-bench -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --backend vulkan --ctx-start 4096 --ctx-max 4096 --gen-tokens 32 --prefill-chunk 4096 --mem-limit-gb 200 > $OUT/profile_vulkan_old.log 2>&1
DS4_WGPU_PROFILE=1 timeout 150 $B/ds4-bench -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --backend vulkan --ctx-start 4096 --ctx-max 4096 --gen-tokens 32 --prefill-chunk 4096 --mem-limit-gb 200 > $OUT/profile_vulkan_new.log 2>&1
grep -c "" $OUT/*
