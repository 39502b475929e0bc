//! The recorder: forwarded media to one file per source
//! ([`ringway_sfu::recording`] format), written by its own thread. The
//! engine offers each packet on a bounded channel and never waits: a full
//! channel drops the packet and counts it. Disk use is bounded by a byte
//! cap (headers included): the first record that would pass it stops the
//! recording, and every packet after that is counted as dropped.

use crate::ServerError;
use ringway_sfu::recording::{file_header, record_header, HEADER_LEN, RECORD_HEADER_LEN};
use serde::Serialize;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Packets the channel holds before the engine drops (about 1 s of 8
/// clients × 500 pps).
pub const QUEUE: usize = 4096;
/// Most sources (files) in one recording; packets of more are dropped.
pub const MAX_SOURCES: usize = 4096;

/// What the recorder did (the final report's `recording`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecordReport {
    /// Directory of the files.
    pub dir: String,
    /// The byte cap.
    pub max_bytes: u64,
    /// Files written (one per source).
    pub files: u64,
    /// Packets written.
    pub packets: u64,
    /// Bytes written (file and record headers included).
    pub bytes: u64,
    /// Packets dropped because the channel was full (the recorder fell
    /// behind; the engine never waits).
    pub dropped_queue_full: u64,
    /// Packets dropped because the byte cap was reached.
    pub dropped_disk_full: u64,
    /// Packets dropped because the recording had `MAX_SOURCES` files.
    pub dropped_too_many_sources: u64,
    /// The byte cap was reached (recording stopped).
    pub full: bool,
    /// Write errors (the recording stopped at the first).
    pub write_errors: u64,
    /// The first write error, if any.
    pub error: Option<String>,
}

struct Item {
    ssid: u32,
    unix_ns: u64,
    packet: Vec<u8>,
}

/// The engine's end of the recorder (engines and the control thread hold
/// clones, one per thread).
#[derive(Clone)]
pub(super) struct RecordTx {
    tx: SyncSender<Item>,
    dropped: Arc<AtomicU64>,
}

impl RecordTx {
    /// Packets dropped on a full channel so far.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Offer a forwarded packet; never blocks.
    pub(super) fn offer(&self, ssid: u32, unix_ns: u64, packet: &[u8]) {
        let item = Item {
            ssid,
            unix_ns,
            packet: packet.to_vec(),
        };
        match self.tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The recorder thread; [`Recorder::finish`] (after the engine dropped
/// its [`RecordTx`]) waits for it and returns its report.
pub(super) struct Recorder {
    dropped: Arc<AtomicU64>,
    thread: JoinHandle<RecordReport>,
}

impl Recorder {
    /// Create `dir` if needed and start the thread.
    pub(super) fn start(dir: &Path, max_bytes: u64) -> Result<(Recorder, RecordTx), ServerError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ServerError::Config(format!("record directory {}: {e}", dir.display())))?;
        let (tx, rx) = sync_channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let writer = Writer {
            dir: dir.to_path_buf(),
            prefix: format!("{stamp}-{}", std::process::id()),
            files: HashMap::new(),
            report: RecordReport {
                dir: dir.display().to_string(),
                max_bytes,
                ..RecordReport::default()
            },
        };
        let thread = std::thread::Builder::new()
            .name("sfu-recorder".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| ServerError::Thread {
                name: "sfu-recorder".into(),
                source,
            })?;
        Ok((
            Recorder {
                dropped: dropped.clone(),
                thread,
            },
            RecordTx { tx, dropped },
        ))
    }

    /// Wait for the thread (its channel must be closed) and return the report.
    pub(super) fn finish(self) -> RecordReport {
        let dropped = self.dropped.load(Ordering::Relaxed);
        let mut report = self.thread.join().unwrap_or_else(|_| RecordReport {
            error: Some("recorder thread panicked".into()),
            ..RecordReport::default()
        });
        report.dropped_queue_full = dropped;
        report
    }
}

struct Writer {
    dir: PathBuf,
    prefix: String,
    files: HashMap<u32, BufWriter<File>>,
    report: RecordReport,
}

impl Writer {
    fn run(mut self, rx: Receiver<Item>) -> RecordReport {
        for item in rx {
            self.write(item);
        }
        for (_, mut f) in self.files.drain() {
            if let Err(err) = f.flush() {
                self.report.write_errors += 1;
                self.report.error.get_or_insert(err.to_string());
            }
        }
        self.report
    }

    /// Write one record (and the file header of a new source), within the cap.
    fn write(&mut self, item: Item) {
        let report = &mut self.report;
        if report.full || report.error.is_some() {
            report.dropped_disk_full += 1;
            return;
        }
        let Some(head) = record_header(item.unix_ns, item.packet.len()) else {
            return; // longer than a receive frame: cannot happen
        };
        let new = !self.files.contains_key(&item.ssid);
        if new && self.files.len() >= MAX_SOURCES {
            report.dropped_too_many_sources += 1;
            return;
        }
        let need =
            (RECORD_HEADER_LEN + item.packet.len() + if new { HEADER_LEN } else { 0 }) as u64;
        if report.bytes.saturating_add(need) > report.max_bytes {
            report.full = true;
            report.dropped_disk_full += 1;
            for file in self.files.values_mut() {
                let _ = file.flush();
            }
            return;
        }
        let result = (|| -> std::io::Result<()> {
            if new {
                let path = self
                    .dir
                    .join(format!("{}-{:08x}.rwrec", self.prefix, item.ssid));
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)?;
                let mut writer = BufWriter::with_capacity(64 << 10, file);
                writer.write_all(&file_header(item.ssid))?;
                self.files.insert(item.ssid, writer);
                report.files += 1;
            }
            let writer = self.files.get_mut(&item.ssid).expect("opened");
            writer.write_all(&head)?;
            writer.write_all(&item.packet)
        })();
        match result {
            Ok(()) => {
                report.bytes += need;
                report.packets += 1;
            }
            Err(e) => {
                report.write_errors += 1;
                report.error = Some(e.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full channel drops and counts; the engine's offer returns at once.
    #[test]
    fn full_channel_counts_and_never_blocks() {
        let (tx, rx) = sync_channel(2);
        let r = RecordTx {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        for k in 0..5 {
            r.offer(1, k, &[0x80, 96, 0, 0]);
        }
        assert_eq!(r.dropped(), 3);
        assert_eq!(rx.try_iter().count(), 2);
    }
}
