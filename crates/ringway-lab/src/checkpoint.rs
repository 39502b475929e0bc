//! A lab's state file: every finished run appended as one JSON line the
//! moment it ends (written and synced), so that a long experiment (an
//! hour of `lab sfu --paper`) is not lost to one failure. The first line
//! names the settings the runs were made with (a fingerprint); resuming
//! with other settings is refused, so runs of two experiments never mix.
//! A line cut by a crash is ended and skipped.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// An open state file.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    file: std::fs::File,
}

/// The first line of a state file.
#[derive(Serialize, serde::Deserialize)]
struct Header {
    checkpoint: String,
}

impl Checkpoint {
    /// Open `path` for the runs of an experiment whose settings are
    /// `fingerprint`. Without `resume` the file must not hold runs yet
    /// (an hour of runs is never overwritten by mistake); with `resume`
    /// the runs already there are returned (a missing file starts a new
    /// one), and a file written with other settings is refused.
    pub fn open<T: DeserializeOwned>(
        path: &Path,
        fingerprint: &str,
        resume: bool,
    ) -> anyhow::Result<(Checkpoint, Vec<T>)> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(anyhow::Error::new(e).context(format!("{}", path.display()))),
        };
        let mut runs = Vec::new();
        let mut lines = text.lines();
        let fresh = text.trim().is_empty();
        if !fresh {
            if !resume {
                anyhow::bail!(
                    "the state file {} already holds runs: add --resume to continue them, or remove it",
                    path.display()
                );
            }
            let first = lines.next().unwrap_or_default();
            let header: Header = serde_json::from_str(first).map_err(|_| {
                anyhow::anyhow!(
                    "{} is not a lab state file (no header line)",
                    path.display()
                )
            })?;
            if header.checkpoint != fingerprint {
                anyhow::bail!(
                    "the state file {} was written with other settings:\n  file: {}\n  now:  {}",
                    path.display(),
                    header.checkpoint,
                    fingerprint
                );
            }
            let mut skipped = 0;
            for line in lines.filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<T>(line) {
                    Ok(run) => runs.push(run),
                    Err(_) => skipped += 1,
                }
            }
            if skipped > 0 {
                log::warn!(
                    "{}: {skipped} unreadable line(s) skipped (cut by a crash?)",
                    path.display()
                );
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::Error::new(e).context(format!("{}", path.display())))?;
        if fresh {
            file.set_len(0)?;
            let mut line = serde_json::to_vec(&Header {
                checkpoint: fingerprint.to_string(),
            })?;
            line.push(b'\n');
            file.write_all(&line)?;
            file.sync_data()?;
        } else if !text.ends_with('\n') {
            // A line cut by a crash: end it so the next run starts clean.
            file.write_all(b"\n")?;
        }
        Ok((
            Checkpoint {
                path: path.to_path_buf(),
                file,
            },
            runs,
        ))
    }

    /// Append one finished run (written and synced before returning).
    pub fn append<T: Serialize>(&mut self, run: &T) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(run)?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| anyhow::Error::new(e).context(format!("{}", self.path.display())))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Attempts at one run a resumed state file may hold before the run
/// counts as made even though every attempt was left out.
pub const MAX_ATTEMPTS: usize = 3;

/// Keys of the runs a resumed grid need not make again, from each finished
/// attempt's `(key, kept)`: those with an attempt that was kept, and those
/// attempted [`MAX_ATTEMPTS`] times. A run left out (other load on the
/// machine, a late generator) is made again on `--resume`: the reasons are
/// interference, not the run's outcome, so the remade run is as valid as
/// any; the attempts left out stay in the state file and in the report.
pub fn settled_keys(
    attempts: impl IntoIterator<Item = (String, bool)>,
) -> std::collections::HashSet<String> {
    let mut seen: std::collections::HashMap<String, (usize, bool)> = Default::default();
    for (key, kept) in attempts {
        let entry = seen.entry(key).or_default();
        entry.0 += 1;
        entry.1 |= kept;
    }
    seen.into_iter()
        .filter(|(_, (tries, kept))| *kept || *tries >= MAX_ATTEMPTS)
        .map(|(key, _)| key)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Run {
        key: String,
        #[serde(deserialize_with = "crate::stats::nan_or_f64")]
        value: f64,
    }

    fn run(key: &str, value: f64) -> Run {
        Run {
            key: key.into(),
            value,
        }
    }

    #[test]
    fn runs_survive_a_restart_and_other_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.jsonl");
        let (mut state, old) = Checkpoint::open::<Run>(&path, "grid A", false).unwrap();
        assert!(old.is_empty());
        state.append(&run("a", 1.5)).unwrap();
        state.append(&run("b", f64::NAN)).unwrap();
        drop(state);
        // Each run is on disk as soon as it is appended.
        let (mut state, old) = Checkpoint::open::<Run>(&path, "grid A", true).unwrap();
        assert_eq!(old.len(), 2);
        assert_eq!(old[0], run("a", 1.5));
        assert!(old[1].value.is_nan(), "n/a reads back as n/a");
        state.append(&run("c", 3.0)).unwrap();
        drop(state);
        let (_, old) = Checkpoint::open::<Run>(&path, "grid A", true).unwrap();
        assert_eq!(old.len(), 3);
        // Without --resume an existing state is never overwritten.
        let e = Checkpoint::open::<Run>(&path, "grid A", false).unwrap_err();
        assert!(e.to_string().contains("--resume"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 4);
        // Other settings: refused, naming both.
        let e = Checkpoint::open::<Run>(&path, "grid B", true).unwrap_err();
        assert!(
            e.to_string().contains("grid A") && e.to_string().contains("grid B"),
            "{e}"
        );
        // A missing file with --resume starts a new one.
        let fresh = dir.path().join("new.jsonl");
        let (_, old) = Checkpoint::open::<Run>(&fresh, "grid A", true).unwrap();
        assert!(old.is_empty());
    }

    #[test]
    fn a_line_cut_by_a_crash_is_skipped_and_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.jsonl");
        let (mut state, _) = Checkpoint::open::<Run>(&path, "g", false).unwrap();
        state.append(&run("a", 1.0)).unwrap();
        drop(state);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(br#"{"key":"b","val"#).unwrap();
        drop(f);
        let (mut state, old) = Checkpoint::open::<Run>(&path, "g", true).unwrap();
        assert_eq!(old, vec![run("a", 1.0)]);
        state.append(&run("c", 2.0)).unwrap();
        drop(state);
        let (_, old) = Checkpoint::open::<Run>(&path, "g", true).unwrap();
        assert_eq!(old, vec![run("a", 1.0), run("c", 2.0)]);
        // Not a state file at all.
        let other = dir.path().join("other.json");
        std::fs::write(&other, "{\"runs\": []}\n").unwrap();
        assert!(Checkpoint::open::<Run>(&other, "g", true).is_err());
    }
}
