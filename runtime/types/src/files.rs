//! Files that are no data: a file of the kernel's reads as an empty regular file (`/proc/self/mem`,
//! `/proc/self/environ`, `/sys/...`), so "a regular file" alone does not keep them out. Every
//! read of a file from outside (a manifest, an index, a model, a component) checks both.

use std::path::Path;

/// Whether `path` (symlinks followed) lies on a filesystem of the kernel's, whose files are no
/// data: procfs, sysfs, debugfs, securityfs, cgroups, tracefs, bpf, configfs, efivarfs.
#[cfg(target_os = "linux")]
pub fn kernel_file(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const KERNEL_FILESYSTEMS: &[u32] = &[
        0x9fa0,      // proc
        0x6265_6572, // sysfs
        0x6462_6720, // debugfs
        0x7363_6673, // securityfs
        0x0027_e0eb, // cgroup
        0x6367_7270, // cgroup2
        0x7472_6163, // tracefs
        0xcafe_4a11, // bpf
        0x6265_6570, // configfs
        0xde5e_81e4, // efivarfs
    ];
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid NUL-terminated path, and a statfs buffer that the call fills on success.
    if unsafe { libc::statfs(path.as_ptr(), fs.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statfs returned 0, so the buffer is filled.
    // Magic numbers are 32 bits, whatever the width of `f_type` on the platform.
    let kind = unsafe { fs.assume_init() }.f_type as u32;
    KERNEL_FILESYSTEMS.contains(&kind)
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_file(_path: &Path) -> bool {
    false
}
