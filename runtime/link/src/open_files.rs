//! The process's open-file limit: a serving operator holds a socket per linked node, and a
//! container's default soft limit (often 1,024) caps a fleet well below what the process could
//! otherwise hold.

/// Raises the soft open-file limit to the hard one; returns (soft, hard) as they are after.
#[cfg(unix)]
pub fn raise_to_hard_limit() -> (u64, u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a properly initialised rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    // rlim_t is 32 bits wide on some targets.
    #[allow(clippy::unnecessary_cast)]
    (limit.rlim_cur as u64, limit.rlim_max as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (soft, hard) = super::raise_to_hard_limit();
        assert!(soft > 0);
        assert_eq!(soft, hard);
    }
}
