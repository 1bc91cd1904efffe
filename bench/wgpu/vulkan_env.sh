# Sourced on the device: the carried Vulkan loader (.gl) unpacked, and NVIDIA's driver named.
# NVIDIA's Vulkan driver lives in libGLX_nvidia, which needs libglvnd's dispatch libraries: carry
# libvulkan1 and the libglvnd packages (libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
for j in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
  [ -f $j ] && { export VK_DRIVER_FILES=$j; break; }
done
[ -f /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ] && export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export XDG_RUNTIME_DIR=/tmp
echo "Vulkan driver: ${VK_DRIVER_FILES:-none found}"
