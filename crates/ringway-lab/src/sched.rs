//! Scheduler profiles for the proxy's threads, and recorded/restored
//! global settings (sysctls, scheduler knobs).
//!
//! Profiles only translate into the proxy's own per-thread flags
//! (`--policy`, `--priority`, `--nice`, `--slice-us`); nothing global.
//! Global changes go through [`SysState`]: every original value is written
//! to a state file *before* the change, restored at the end (also on drop),
//! and a leftover state file from a crashed run is restored by
//! [`SysState::recover`] at the next start. Recovery trusts the file only
//! so far (review S16): it must be a regular file owned by the invoking
//! user and writable by nobody else, every path must lie under /proc/sys
//! or /sys (no `..`), and a value is put back only while the knob still
//! holds the value this tool wrote (an administrator's later change stays).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A named scheduler profile for the proxy's worker threads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// Name used on the command line and in reports.
    pub name: String,
    /// `other`, `fifo` or `rr` (None: leave as is).
    pub policy: Option<String>,
    /// Real-time priority (fifo/rr).
    pub priority: Option<i32>,
    /// Nice value (SCHED_OTHER).
    pub nice: Option<i32>,
    /// EEVDF slice request in microseconds (sched_setattr sched_runtime).
    pub slice_us: Option<u64>,
}

/// Names accepted by [`profile`].
pub const PROFILES: &[&str] = &[
    "default",
    "fifo",
    "rr",
    "nice-10",
    "slice-100us",
    "slice-1ms",
    "slice-3ms",
];

/// Look up a profile by name: one of [`PROFILES`], or `slice-<N>us` /
/// `slice-<N>ms` / `fifo-<prio>` / `nice<N>`.
pub fn profile(name: &str) -> Result<Profile, String> {
    let mut built = Profile {
        name: name.to_string(),
        policy: None,
        priority: None,
        nice: None,
        slice_us: None,
    };
    let bad = || {
        format!(
            "unknown scheduler profile {name:?} (known: {}, slice-<N>us|ms, fifo-<1..99>, nice<-20..19>)",
            PROFILES.join(", ")
        )
    };
    match name {
        "default" => {}
        "fifo" => {
            built.policy = Some("fifo".into());
            built.priority = Some(10);
        }
        "rr" => {
            built.policy = Some("rr".into());
            built.priority = Some(10);
        }
        _ => {
            if let Some(slice) = name.strip_prefix("slice-") {
                let micros = if let Some(digits) = slice.strip_suffix("us") {
                    digits.parse::<u64>().map_err(|_| bad())?
                } else if let Some(digits) = slice.strip_suffix("ms") {
                    digits.parse::<u64>().map_err(|_| bad())? * 1000
                } else {
                    return Err(bad());
                };
                if !(100..=100_000).contains(&micros) {
                    return Err(format!(
                        "profile {name:?}: EEVDF slices must be 100 µs ..= 100 ms"
                    ));
                }
                built.policy = Some("other".into());
                built.slice_us = Some(micros);
            } else if let Some(slice) = name.strip_prefix("fifo-") {
                let prio: i32 = slice.parse().map_err(|_| bad())?;
                if !(1..=99).contains(&prio) {
                    return Err(bad());
                }
                built.policy = Some("fifo".into());
                built.priority = Some(prio);
            } else if let Some(slice) = name.strip_prefix("nice") {
                let digits: i32 = slice.parse().map_err(|_| bad())?;
                if !(-20..=19).contains(&digits) {
                    return Err(bad());
                }
                built.policy = Some("other".into());
                built.nice = Some(digits);
            } else {
                return Err(bad());
            }
        }
    }
    Ok(built)
}

impl Profile {
    /// Flags for `ringway sip proxy` that apply this profile to its threads.
    pub fn proxy_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(policy) = &self.policy {
            args.push("--policy".into());
            args.push(policy.clone());
        }
        if let Some(policy) = self.priority {
            args.push("--priority".into());
            args.push(policy.to_string());
        }
        if let Some(nice) = self.nice {
            args.push(format!("--nice={nice}"));
        }
        if let Some(slice) = self.slice_us {
            args.push("--slice-us".into());
            args.push(slice.to_string());
        }
        args
    }

    /// `chrt`-style prefix for external proxies (Kamailio): the command and
    /// arguments to put in front, or an explanation why it cannot be applied.
    /// (A slice is not part of the prefix: the lab sets it on the running
    /// proxy's threads with `sched_setattr`.)
    pub fn external_prefix(&self) -> Result<Vec<String>, String> {
        let mut args = Vec::new();
        match (self.policy.as_deref(), self.priority) {
            (Some("fifo"), Some(p)) => args.extend(["chrt".into(), "-f".into(), p.to_string()]),
            (Some("rr"), Some(p)) => args.extend(["chrt".into(), "-r".into(), p.to_string()]),
            (Some("batch"), _) => args.extend(["chrt".into(), "-b".into(), "0".into()]),
            _ => {}
        }
        if let Some(nice) = self.nice {
            args.extend(["nice".into(), "-n".into(), nice.to_string()]);
        }
        Ok(args)
    }
}

/// One global setting: a file under /proc/sys or /sys and its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knob {
    /// Absolute path of the knob.
    pub path: String,
    /// Value to write (or, in the state file, the original value).
    pub value: String,
}

impl Knob {
    /// A sysctl by dotted name (`net.core.rmem_max`).
    pub fn sysctl(name: &str, value: impl ToString) -> Knob {
        Knob {
            path: format!("/proc/sys/{}", name.replace('.', "/")),
            value: value.to_string(),
        }
    }
}

/// Where recovered knobs may live.
pub const KNOB_ROOTS: [&str; 2] = ["/proc/sys", "/sys"];

/// One changed knob in the state file.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Entry {
    /// Absolute path of the knob.
    path: String,
    /// Its original value (restored).
    value: String,
    /// The value this tool wrote (restore only while it is still there;
    /// absent in files of older versions: then nothing is restored).
    #[serde(default)]
    written: Option<String>,
}

/// State file contents.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct StateFile {
    /// PID of the tool that made the changes.
    pid: u32,
    /// Original values to restore.
    originals: Vec<Entry>,
}

/// Global settings changed by this run, restored on [`SysState::restore`] or drop.
#[derive(Debug)]
pub struct SysState {
    file: PathBuf,
    originals: Vec<Knob>,
    /// The value written to each of `originals`.
    written: Vec<String>,
    restored: bool,
}

fn write_state(file: &Path, originals: &[Knob], written: &[String]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let state = StateFile {
        pid: std::process::id(),
        originals: originals
            .iter()
            .zip(written)
            .map(|(k, w)| Entry {
                path: k.path.clone(),
                value: k.value.clone(),
                written: Some(w.clone()),
            })
            .collect(),
    };
    let tmp = file.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    // Owner-only, whatever the umask: recovery refuses anything else.
    let mut state_file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    state_file.write_all(&serde_json::to_vec_pretty(&state).map_err(std::io::Error::other)?)?;
    state_file.sync_all()?;
    std::fs::rename(&tmp, file)
}

/// The effective user id of this process (from /proc/self/status).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    uids.split_whitespace().nth(1)?.parse().ok()
}

/// Why the state file at `file` is not to be trusted, if it is not: it
/// must be a regular file (not a symlink) owned by this process's
/// effective user and not writable by group or others.
fn untrusted(file: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = match std::fs::symlink_metadata(file) {
        Ok(meta) => meta,
        Err(e) => return Some(format!("cannot stat: {e}")),
    };
    if !meta.file_type().is_file() {
        return Some("not a regular file".into());
    }
    match effective_uid() {
        Some(uid) if uid == meta.uid() => {}
        Some(uid) => return Some(format!("owned by uid {}, not {uid}", meta.uid())),
        None => return Some("cannot tell who runs this process".into()),
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "mode {:o}: writable by group or others",
            meta.mode() & 0o777
        ));
    }
    None
}

/// `path` if it is an absolute path without `.`/`..` that resolves to a
/// file under one of `roots`; else why not.
fn allowed_knob(path: &str, roots: &[&Path]) -> Result<PathBuf, String> {
    use std::path::Component;
    let path_ref = Path::new(path);
    if !path_ref.is_absolute()
        || path_ref
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err("not a plain absolute path".into());
    }
    let real = path_ref
        .canonicalize()
        .map_err(|e| format!("cannot resolve: {e}"))?;
    let under = roots.iter().any(|root| {
        root.canonicalize()
            .is_ok_and(|root| real.starts_with(&root))
    });
    if !under {
        let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        return Err(format!("not under {}", roots.join(" or ")));
    }
    Ok(real)
}

/// The value a knob holds now, as [`SysState::apply`] compares it with the
/// value it wrote (`sched/features`: the state of that one feature).
fn current_value(path: &Path, written: &str) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    Ok(if path.ends_with("sched/features") {
        feature_state(&text, written)
    } else {
        text.trim().to_string()
    })
}

/// Restore the entries of a recovered state file under `roots`, each only
/// while it still holds the value we wrote.
fn recover_entries(entries: &[Entry], roots: &[&Path]) -> Vec<String> {
    let mut msgs = Vec::new();
    for e in entries.iter().rev() {
        let path = match allowed_knob(&e.path, roots) {
            Ok(path) => path,
            Err(why) => {
                msgs.push(format!("not restored: {} ({why})", e.path));
                continue;
            }
        };
        let Some(written) = &e.written else {
            msgs.push(format!(
                "not restored: {} (the file does not say what was written)",
                e.path
            ));
            continue;
        };
        match current_value(&path, written) {
            Ok(now) if now == *written => msgs.extend(restore_knobs(&[Knob {
                path: path.display().to_string(),
                value: e.value.clone(),
            }])),
            Ok(now) => msgs.push(format!(
                "not restored: {} is {now}, not the {written} we wrote (changed since; left as is)",
                e.path
            )),
            Err(err) => msgs.push(format!("not restored: {} (cannot read: {err})", e.path)),
        }
    }
    msgs
}

fn restore_knobs(originals: &[Knob]) -> Vec<String> {
    let mut msgs = Vec::new();
    for k in originals.iter().rev() {
        match std::fs::write(&k.path, &k.value) {
            Ok(()) => msgs.push(format!("restored {} = {}", k.path, k.value)),
            Err(e) => msgs.push(format!("could not restore {} = {}: {e}", k.path, k.value)),
        }
    }
    msgs
}

/// The current state of the feature `want` names (`NO_X` or `X`) in the
/// text of a sched `features` file: the token to write back to restore it.
pub fn feature_state(features: &str, want: &str) -> String {
    let name = want.strip_prefix("NO_").unwrap_or(want);
    let negated = format!("NO_{name}");
    if features.split_whitespace().any(|t| t == negated) {
        negated
    } else {
        name.to_string()
    }
}

impl SysState {
    /// Restore settings left by a run that did not finish (crash, kill):
    /// returns messages saying what was restored (empty if no state file).
    /// Only knobs under [`KNOB_ROOTS`], from a file this user owns and
    /// nobody else can write, and only while they hold what we wrote.
    pub fn recover(file: &Path) -> Vec<String> {
        let roots: Vec<&Path> = KNOB_ROOTS.iter().map(Path::new).collect();
        Self::recover_under(file, &roots)
    }

    /// [`SysState::recover`] with knobs allowed under `roots` instead (tests
    /// use stand-in files in a temporary directory).
    pub fn recover_under(file: &Path, roots: &[&Path]) -> Vec<String> {
        if std::fs::symlink_metadata(file).is_err() {
            return Vec::new();
        }
        let mut msgs = vec![format!(
            "found leftover state file {} (an earlier run did not finish): restoring",
            file.display()
        )];
        if let Some(why) = untrusted(file) {
            msgs.push(format!(
                "state file not trusted ({why}): nothing restored, file left for inspection"
            ));
            return msgs;
        }
        let Ok(text) = std::fs::read_to_string(file) else {
            msgs.push("state file unreadable; nothing restored".into());
            return msgs;
        };
        match serde_json::from_str::<StateFile>(&text) {
            Ok(s) => msgs.extend(recover_entries(&s.originals, roots)),
            Err(e) => msgs.push(format!("state file unreadable ({e}); nothing restored")),
        }
        let _ = std::fs::remove_file(file);
        msgs
    }

    /// Apply `changes`, recording each original value in `file` before it
    /// is changed. Returns the guard and one message per knob saying what
    /// was applied and what could not be (and why).
    pub fn apply(file: &Path, changes: &[Knob]) -> (SysState, Vec<String>) {
        let mut state = SysState {
            file: file.to_path_buf(),
            originals: Vec::new(),
            written: Vec::new(),
            restored: false,
        };
        let mut msgs = Vec::new();
        for c in changes {
            let orig = match std::fs::read_to_string(&c.path) {
                Ok(v) if c.path.ends_with("sched/features") => feature_state(&v, &c.value),
                Ok(v) => v.trim().to_string(),
                Err(error) => {
                    msgs.push(format!("not applied: {} (cannot read: {error})", c.path));
                    continue;
                }
            };
            if orig == c.value {
                msgs.push(format!("{} already {}", c.path, c.value));
                continue;
            }
            state.originals.push(Knob {
                path: c.path.clone(),
                value: orig.clone(),
            });
            state.written.push(c.value.clone());
            if let Err(error) = write_state(file, &state.originals, &state.written) {
                state.originals.pop();
                state.written.pop();
                msgs.push(format!(
                    "not applied: {} (cannot record the original in {}: {error})",
                    c.path,
                    file.display()
                ));
                continue;
            }
            match std::fs::write(&c.path, &c.value) {
                Ok(()) => msgs.push(format!("set {} = {} (was {orig})", c.path, c.value)),
                Err(error) => {
                    state.originals.pop();
                    state.written.pop();
                    let _ = write_state(file, &state.originals, &state.written);
                    let why = if error.raw_os_error() == Some(1)
                        && c.path.starts_with("/sys/kernel/debug")
                    {
                        " (debugfs locked down?)".to_string()
                    } else {
                        String::new()
                    };
                    msgs.push(format!(
                        "not applied: {} = {}: {error}{why}",
                        c.path, c.value
                    ));
                }
            }
        }
        if state.originals.is_empty() {
            let _ = std::fs::remove_file(file);
        }
        (state, msgs)
    }

    /// Knobs changed (with their original values).
    pub fn originals(&self) -> &[Knob] {
        &self.originals
    }

    /// Put every original value back and delete the state file.
    pub fn restore(mut self) -> Vec<String> {
        self.do_restore()
    }

    fn do_restore(&mut self) -> Vec<String> {
        if self.restored {
            return Vec::new();
        }
        self.restored = true;
        let msgs = restore_knobs(&self.originals);
        let _ = std::fs::remove_file(&self.file);
        msgs
    }
}

impl Drop for SysState {
    fn drop(&mut self) {
        for m in self.do_restore() {
            log::info!("{m}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_map_to_proxy_flags() {
        assert!(profile("default").unwrap().proxy_args().is_empty());
        assert_eq!(
            profile("fifo").unwrap().proxy_args(),
            vec!["--policy", "fifo", "--priority", "10"]
        );
        assert_eq!(
            profile("slice-3ms").unwrap().proxy_args(),
            vec!["--policy", "other", "--slice-us", "3000"]
        );
        assert_eq!(profile("slice-100us").unwrap().slice_us, Some(100));
        assert_eq!(
            profile("nice-5").unwrap().proxy_args(),
            vec!["--policy", "other", "--nice=-5"]
        );
        assert!(profile("slice-5us").is_err());
        assert!(profile("fifo-0").is_err());
        assert!(profile("turbo").unwrap_err().contains("unknown"));
        assert!(profile("slice-3ms")
            .unwrap()
            .external_prefix()
            .unwrap()
            .is_empty());
        assert_eq!(
            profile("fifo").unwrap().external_prefix().unwrap(),
            vec!["chrt", "-f", "10"]
        );
    }

    #[test]
    fn state_is_recorded_before_change_and_restored_after_crash() {
        let dir = std::env::temp_dir().join(format!("ringway-sched-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let knob = dir.join("knob");
        std::fs::write(&knob, "100\n").unwrap();
        let state = dir.join("state.json");
        let k = Knob {
            path: knob.display().to_string(),
            value: "200".into(),
        };
        let missing = Knob {
            path: dir.join("nope/knob").display().to_string(),
            value: "1".into(),
        };
        let (st, msgs) = SysState::apply(&state, &[k.clone(), missing]);
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "200");
        assert!(
            msgs.iter().any(|m| m.starts_with("not applied")),
            "{msgs:?}"
        );
        // The state file holds the original while the change is active.
        let s: StateFile = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        assert_eq!(s.originals[0].value, "100");
        // Simulate a crash: forget the guard without restoring.
        std::mem::forget(st);
        let msgs = SysState::recover_under(&state, &[&dir]);
        assert!(msgs[0].contains("leftover"));
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "100");
        assert!(!state.exists());
        assert!(SysState::recover_under(&state, &[&dir]).is_empty());
        // Normal path: restore on drop.
        {
            let (_st, _) = SysState::apply(&state, std::slice::from_ref(&k));
            assert!(state.exists());
        }
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "100");
        assert!(!state.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A state file as a crashed run leaves it: knob `path` changed from
    /// `original` to `written`.
    fn leftover(state: &Path, entries: &[(&Path, &str, &str)]) {
        let originals: Vec<Knob> = entries
            .iter()
            .map(|(p, original, _)| Knob {
                path: p.display().to_string(),
                value: original.to_string(),
            })
            .collect();
        let written: Vec<String> = entries.iter().map(|e| e.2.to_string()).collect();
        write_state(state, &originals, &written).unwrap();
    }

    /// Review S16: recovery wrote any path/value of the state file (as
    /// root, from a file anyone with write access to results/ could plant).
    #[test]
    fn recovery_trusts_only_its_own_file_paths_and_values() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let allowed = dir.join("sys");
        std::fs::create_dir_all(&allowed).unwrap();
        let knob = allowed.join("knob");
        let outside = dir.join("cron-job");
        let state = dir.join("state.json");
        let roots = [allowed.as_path()];

        // A path outside the roots (directly, or through `..`) is refused.
        std::fs::write(&knob, "200").unwrap();
        std::fs::write(&outside, "harmless").unwrap();
        let sneaky = PathBuf::from(format!("{}/../cron-job", allowed.display()));
        leftover(
            &state,
            &[
                (&outside, "* * * * * root evil", "harmless"),
                (&sneaky, "evil", "harmless"),
                (&knob, "100", "200"),
            ],
        );
        let msgs = SysState::recover_under(&state, &roots);
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap(),
            "harmless",
            "{msgs:?}"
        );
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "100", "{msgs:?}");
        assert_eq!(
            msgs.iter()
                .filter(|m| m.starts_with("not restored"))
                .count(),
            2
        );
        assert!(!state.exists());

        // A value changed since we wrote it is left alone.
        std::fs::write(&knob, "300").unwrap();
        leftover(&state, &[(&knob, "100", "200")]);
        let msgs = SysState::recover_under(&state, &roots);
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "300", "{msgs:?}");

        // A group- or world-writable file is not trusted (and kept).
        std::fs::write(&knob, "200").unwrap();
        leftover(&state, &[(&knob, "100", "200")]);
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o666)).unwrap();
        let msgs = SysState::recover_under(&state, &roots);
        assert!(msgs.iter().any(|m| m.contains("not trusted")), "{msgs:?}");
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "200");
        assert!(state.exists());

        // Nor a file of another user (checkable as root: chown it away).
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o600)).unwrap();
        if effective_uid() == Some(0) {
            std::os::unix::fs::chown(&state, Some(65534), None).unwrap();
            let msgs = SysState::recover_under(&state, &roots);
            assert!(
                msgs.iter().any(|m| m.contains("owned by uid 65534")),
                "{msgs:?}"
            );
            assert_eq!(std::fs::read_to_string(&knob).unwrap(), "200");
            std::os::unix::fs::chown(&state, Some(0), None).unwrap();
        }
        // Our own file, our value still there: restored.
        let msgs = SysState::recover_under(&state, &roots);
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "100", "{msgs:?}");
        // The default roots are /proc/sys and /sys.
        leftover(&state, &[(&knob, "7", "100")]);
        let msgs = SysState::recover(&state);
        assert_eq!(std::fs::read_to_string(&knob).unwrap(), "100", "{msgs:?}");
    }
}
