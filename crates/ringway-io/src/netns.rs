//! Network-namespace helpers for tests and experiments.

use std::io;
use std::process::Command;

/// Run `f` on a new thread inside a fresh, private network namespace that
/// has only `lo` (brought up). Threads and child processes started from `f`
/// inherit the namespace; it disappears when the last of them ends.
pub fn in_private_netns<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    std::thread::spawn(move || -> io::Result<T> {
        // SAFETY: unshare only changes this thread's namespace membership; no
        // memory is shared with the kernel.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let st = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()?;
        if !st.success() {
            return Err(io::Error::other(
                "ip link set lo up failed in private netns",
            ));
        }
        Ok(f())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
