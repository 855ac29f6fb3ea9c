//! Files that are no data: a file of the kernel's reads as an empty regular file (`/proc/self/mem`,
//! `/proc/self/environ`, `/sys/...`), so "a regular file" alone does not keep them out. Every
//! read of a file from outside (a manifest, an index, a model, a component) checks both.

use std::path::Path;

/// The kernel's filesystems, whose files are no data, by their magic number (`statfs(2)`).
const KERNEL_FILESYSTEMS: &[(u32, &str)] = &[
    (0x9fa0, "procfs"),
    (0x6265_6572, "sysfs"),
    (0x6462_6720, "debugfs"),
    (0x7363_6673, "securityfs"),
    (0x0027_e0eb, "cgroupfs"),
    (0x6367_7270, "cgroup2fs"),
    (0x7472_6163, "tracefs"),
    (0xcafe_4a11, "bpffs"),
    (0x6265_6570, "configfs"),
    (0xde5e_81e4, "efivarfs"),
];

/// The kernel filesystem a `statfs` result names, if it is one.
#[cfg(target_os = "linux")]
fn named(stats: &libc::statfs) -> Option<&'static str> {
    // Magic numbers are 32 bits, whatever the width of `f_type` on the platform.
    let kind = stats.f_type as u32;
    KERNEL_FILESYSTEMS.iter().find(|(magic, _)| *magic == kind).map(|(_, name)| *name)
}

/// The kernel filesystem `path` (symlinks followed) lies on, if it does.
#[cfg(target_os = "linux")]
pub fn kernel_filesystem(path: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid NUL-terminated path, and a statfs buffer that the call fills on success.
    if unsafe { libc::statfs(path.as_ptr(), stats.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statfs returned 0, so the buffer is filled.
    named(&unsafe { stats.assume_init() })
}

/// The kernel filesystem an open file lies on, if it does (checked on the descriptor: the file
/// read is the file checked).
#[cfg(target_os = "linux")]
pub fn kernel_filesystem_of(file: &std::fs::File) -> Option<&'static str> {
    use std::os::fd::AsRawFd;
    let mut stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs(2) fills `stats` from an open descriptor we own; it is read only on success.
    if unsafe { libc::fstatfs(file.as_raw_fd(), stats.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstatfs returned 0, so the buffer is filled.
    named(&unsafe { stats.assume_init() })
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_filesystem(_path: &Path) -> Option<&'static str> {
    None
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_filesystem_of(_file: &std::fs::File) -> Option<&'static str> {
    None
}

/// Whether `path` (symlinks followed) lies on a filesystem of the kernel's.
pub fn kernel_file(path: &Path) -> bool {
    kernel_filesystem(path).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_files_are_told_from_data() {
        assert_eq!(kernel_filesystem(Path::new("/proc/self/mem")), Some("procfs"));
        assert_eq!(kernel_filesystem_of(&std::fs::File::open("/proc/self/status").unwrap()), Some("procfs"));
        let dir = std::env::temp_dir();
        assert_eq!(kernel_filesystem(&dir), None, "{}", dir.display());
    }
}
