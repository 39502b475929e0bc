//! `ringway sfu record ...`: recordings made by `sfu serve --record-dir`.

use anyhow::Context;
use ringway_sfu::recording::{convert, wav, ConvertStats, PayloadMap, Reader};
use std::io::Read;
use std::path::{Path, PathBuf};

/// `ringway sfu record` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum RecordCmd {
    /// Convert L16/L24 RTP payloads to one WAV file per track (source SSRC
    /// and payload type), through a payload-type map.
    Convert(ConvertArgs),
}

/// `ringway sfu record convert` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ConvertArgs {
    /// Payload type map entry `PT=ENC/RATE[/CHANNELS]`, ENC L16 or L24
    /// (repeatable), e.g. `--pt 96=L16/48000/1 --pt 97=L24/48000/2`.
    /// Packets of other payload types are counted and skipped.
    #[arg(long = "pt", required = true)]
    pub pt: Vec<String>,
    /// Directory for the WAV files (created if needed).
    #[arg(long, value_hint = clap::ValueHint::DirPath)]
    pub out: PathBuf,
    /// Refuse recording files larger than this (bytes).
    #[arg(long, default_value_t = 1 << 31)]
    pub max_file_bytes: u64,
    /// Recording files (`*.rwrec`), or directories holding them.
    #[arg(required = true, value_hint = clap::ValueHint::AnyPath)]
    pub inputs: Vec<PathBuf>,
}

/// Run a `ringway sfu record` subcommand.
pub(crate) fn run(c: RecordCmd) -> anyhow::Result<()> {
    match c {
        RecordCmd::Convert(a) => run_convert(a),
    }
}

/// The recording files named by `inputs` (directories: their `*.rwrec`,
/// sorted).
fn input_files(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "rwrec"))
                .collect();
            in_dir.sort();
            files.extend(in_dir);
        } else {
            files.push(p.clone());
        }
    }
    anyhow::ensure!(!files.is_empty(), "no recording files (*.rwrec) found");
    Ok(files)
}

fn read_bounded(path: &Path, max: u64) -> anyhow::Result<Vec<u8>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut data = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut data)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        data.len() as u64 <= max,
        "{}: larger than --max-file-bytes {max}",
        path.display()
    );
    Ok(data)
}

fn run_convert(a: ConvertArgs) -> anyhow::Result<()> {
    let mut map = PayloadMap::default();
    for e in &a.pt {
        map.add(e).map_err(anyhow::Error::msg)?;
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut failed = 0;
    let mut written = 0;
    for path in input_files(&a.inputs)? {
        let data = read_bounded(&path, a.max_file_bytes)?;
        let reader = match Reader::new(&data) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                failed += 1;
                continue;
            }
        };
        let mut records = Vec::new();
        for r in reader {
            match r {
                Ok(r) => records.push(r),
                Err(e) => {
                    // A recorder that stopped mid-write: keep what came before.
                    eprintln!("{}: {e}; converting the records before it", path.display());
                    failed += 1;
                }
            }
        }
        let mut stats = ConvertStats::default();
        let tracks = convert(records, &map, &mut stats);
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "recording".into());
        for t in &tracks {
            let out = a
                .out
                .join(format!("{stem}-{:08x}-pt{}.wav", t.ssrc, t.payload_type));
            let bytes = wav(t).with_context(|| {
                format!("{}: track too long for a WAV file (4 GiB)", out.display())
            })?;
            std::fs::write(&out, bytes).with_context(|| format!("writing {}", out.display()))?;
            let frames = t.samples.len() / t.format.channels as usize;
            println!(
                "{}: {} frames ({:.3} s, {:?} {} Hz x{})",
                out.display(),
                frames,
                frames as f64 / f64::from(t.format.rate),
                t.format.encoding,
                t.format.rate,
                t.format.channels
            );
            written += 1;
        }
        println!(
            "{}: records={} not_rtp={} unmapped={} bad_payload={} duplicates={} too_early={} gaps={} discontinuities={}",
            path.display(),
            stats.records,
            stats.not_rtp,
            stats.unmapped,
            stats.bad_payload,
            stats.duplicates,
            stats.too_early,
            stats.gaps,
            stats.discontinuities
        );
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} recording file(s) could not be read completely"
    );
    if written == 0 {
        eprintln!("no track had a payload type in the map");
    }
    Ok(())
}
