# Sourced by the device scripts: the wgpu test binaries carried in $B, on the GPU through Vulkan, one
# thread each -> $OUT/wgpu_tests.log (the summary lines and the adapter each ran on are printed).
for t in $B/wgpu-*-tests; do
  timeout 100 $t --test-threads 1 2>&1 | tee -a $OUT/wgpu_tests.log | grep -E "test result|on .*\(Vulkan\)"
done
