//! The process' limit of open files (RLIMIT_NOFILE): every connection a
//! server holds is one descriptor, so its connection bounds must lie below
//! it (a server raises its soft limit up to the hard one at start).

use std::io;

/// The soft and hard limits of open files (`u64::MAX`: unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// The limit in force.
    pub soft: u64,
    /// How far an unprivileged process may raise it.
    pub hard: u64,
}

fn from_raw(v: libc::rlim_t) -> u64 {
    if v == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        v
    }
}

/// This process' limits of open files now.
pub fn open_files() -> io::Result<OpenFiles> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OpenFiles {
        soft: from_raw(limit.rlim_cur),
        hard: from_raw(limit.rlim_max),
    })
}

/// Raise the soft limit of open files to at least `wanted` where the hard
/// limit allows (never above it, never lowered): the limits afterwards.
pub fn raise_open_files(wanted: u64) -> io::Result<OpenFiles> {
    let now = open_files()?;
    if now.soft >= wanted {
        return Ok(now);
    }
    let soft = wanted.min(now.hard);
    let limit = libc::rlimit {
        rlim_cur: if soft == u64::MAX {
            libc::RLIM_INFINITY
        } else {
            soft as libc::rlim_t
        },
        rlim_max: if now.hard == u64::MAX {
            libc::RLIM_INFINITY
        } else {
            now.hard as libc::rlim_t
        },
    };
    // SAFETY: setrlimit reads one live rlimit; the hard limit is kept as it
    // is, the soft one raised within it (allowed without privileges).
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    open_files()
}

/// Whether `e` says the process (EMFILE) or the system (ENFILE) is out of
/// file descriptors.
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_within_the_hard_one() {
        let before = open_files().unwrap();
        assert!(before.soft <= before.hard);
        if before.hard == u64::MAX {
            return; // Not on Linux (nr_open bounds it); nothing to check.
        }
        // Asking for what is in force changes nothing.
        assert_eq!(raise_open_files(before.soft).unwrap(), before);
        // Asking for more gives at most the hard limit.
        let after = raise_open_files(before.hard.saturating_add(1)).unwrap();
        assert_eq!(after.hard, before.hard);
        assert_eq!(after.soft, before.hard);
    }
}
