/* SPDX-License-Identifier: MIT */
/*
 * The part of KFD's ioctl interface (/dev/kfd, Linux's kfd_ioctl.h) the test programs that
 * export a KFD BO as a dma-buf use (shared-bo.c, dmabuf-map.c): our own declarations of its
 * layout and numbers, with their sizes checked at compile time. Debian's copy of the kernel
 * header needs DRM headers Debian does not ship, and lacks EXPORT_DMABUF (KFD 1.12).
 */
#ifndef CRIU_ROCM_TEST_KFD_UAPI_H
#define CRIU_ROCM_TEST_KFD_UAPI_H

#include <stdint.h>
#include <sys/ioctl.h>

/* One GPU's apertures, an entry of GET_PROCESS_APERTURES_NEW's array. */
struct kfd_apertures {
	uint64_t lds_base, lds_limit, scratch_base, scratch_limit, gpuvm_base, gpuvm_limit;
	uint32_t gpu_id, pad;
};
struct kfd_apertures_args {
	uint64_t ptr; /* to num_of_nodes struct kfd_apertures */
	uint32_t num_of_nodes, pad;
};
struct kfd_acquire_vm_args {
	uint32_t drm_fd, gpu_id;
};
struct kfd_alloc_args {
	uint64_t va_addr, size, handle, mmap_offset;
	uint32_t gpu_id, flags;
};
struct export_dmabuf_args {
	uint64_t handle;
	uint32_t flags; /* O_CLOEXEC and the access mode of the dma-buf */
	uint32_t dmabuf_fd;
};

_Static_assert(sizeof(struct kfd_apertures) == 56, "KFD's process apertures are 56 bytes");
_Static_assert(sizeof(struct kfd_apertures_args) == 16,
	       "GET_PROCESS_APERTURES_NEW's argument is 16 bytes");
_Static_assert(sizeof(struct kfd_acquire_vm_args) == 8, "ACQUIRE_VM's argument is 8 bytes");
_Static_assert(sizeof(struct kfd_alloc_args) == 40, "ALLOC_MEMORY_OF_GPU's argument is 40 bytes");
_Static_assert(sizeof(struct export_dmabuf_args) == 16, "EXPORT_DMABUF's argument is 16 bytes");

#define KFD_GET_PROCESS_APERTURES_NEW _IOWR('K', 0x14, struct kfd_apertures_args)
#define KFD_ACQUIRE_VM _IOW('K', 0x15, struct kfd_acquire_vm_args)
#define KFD_ALLOC_MEMORY_OF_GPU _IOWR('K', 0x16, struct kfd_alloc_args)
#define KFD_EXPORT_DMABUF _IOWR('K', 0x24, struct export_dmabuf_args)

/* ALLOC_MEMORY_OF_GPU's flags */
#define KFD_ALLOC_VRAM (1u << 0)
#define KFD_ALLOC_PUBLIC (1u << 29)
#define KFD_ALLOC_WRITABLE (1u << 31)

#endif
