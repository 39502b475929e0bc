//! The logger behind the library crates' `log` calls: the binary installs
//! it once, the libraries only emit.
//!
//! Levels: a filter spec `LEVEL[,MODULE=LEVEL]...` (e.g.
//! `info,ringway_server::sip=debug`), from `--log-level` (or the config
//! file's `log-level`), else `RINGWAY_LOG`, else `info`; the most specific
//! module prefix wins. The management API's `PUT /log-level?level=SPEC`
//! (`ringway ctl log-level SPEC`) replaces it at run time.
//!
//! Formats (`--log-format`): `text` reads as the crates' lines did when they
//! printed (the message alone at `info`, `warning: ` / `error: ` before it
//! at those levels, the module path at `debug` and `trace`); `json` writes
//! one object per line: `ts` (RFC 3339, UTC), `level`, `target`, `thread`,
//! `msg`. A line is written whole with one `write` to stderr.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::sync::RwLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// How lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The log options of the long-running servers (`sip proxy`, `sip
/// dispatch`, `sfu serve`); keys `log-format` and `log-level` in a file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log line format on stderr.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log levels: LEVEL[,MODULE=LEVEL]... (e.g. `info,ringway_server::sip=debug`); default
    /// RINGWAY_LOG, else info. Settable at run time with `ringway ctl log-level`.
    #[arg(long, value_parser = parse_spec)]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// Apply the options given (those absent leave the logger as it is).
    pub fn apply(&self) {
        if let Some(format) = self.log_format {
            set_format(format);
        }
        if let Some(spec) = &self.log_level {
            // Parsed by clap already.
            let _ = set_spec(spec);
        }
    }
}

fn parse_spec(text: &str) -> Result<String, String> {
    Filter::parse(text).map(|f| f.to_string())
}

/// Levels by module path.
#[derive(Clone, Debug, PartialEq)]
struct Filter {
    default: LevelFilter,
    /// Most specific (longest) first.
    modules: Vec<(String, LevelFilter)>,
}

impl Filter {
    fn parse(spec: &str) -> Result<Filter, String> {
        let mut filter = Filter {
            default: LevelFilter::Info,
            modules: Vec::new(),
        };
        let level = |text: &str| {
            text.trim()
                .parse::<LevelFilter>()
                .map_err(|_| format!("{text:?}: a level is off, error, warn, info, debug or trace"))
        };
        for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match directive.split_once('=') {
                None => filter.default = level(directive)?,
                Some((module, value)) => {
                    let module = module.trim();
                    if module.is_empty()
                        || !module
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                    {
                        return Err(format!("{module:?}: not a module path"));
                    }
                    let value = level(value)?;
                    filter.modules.retain(|(m, _)| m != module);
                    filter.modules.push((module.to_string(), value));
                }
            }
        }
        filter.modules.sort_by_key(|m| std::cmp::Reverse(m.0.len()));
        Ok(filter)
    }

    fn level_for(&self, target: &str) -> LevelFilter {
        self.modules
            .iter()
            .find(|(module, _)| {
                target
                    .strip_prefix(module.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
            })
            .map_or(self.default, |(_, level)| *level)
    }

    fn max(&self) -> LevelFilter {
        self.modules
            .iter()
            .map(|(_, level)| *level)
            .fold(self.default, Ord::max)
    }
}

impl std::fmt::Display for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.default.as_str().to_ascii_lowercase())?;
        let mut modules = self.modules.clone();
        modules.sort();
        for (module, level) in modules {
            write!(f, ",{module}={}", level.as_str().to_ascii_lowercase())?;
        }
        Ok(())
    }
}

struct Logger {
    state: RwLock<(Filter, LogFormat)>,
}

static LOGGER: Logger = Logger {
    state: RwLock::new((
        Filter {
            default: LevelFilter::Info,
            modules: Vec::new(),
        },
        LogFormat::Text,
    )),
};

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        metadata.level() <= state.0.level_for(metadata.target())
    }

    fn log(&self, record: &Record<'_>) {
        let format = {
            let state = self.state.read().unwrap_or_else(|e| e.into_inner());
            if record.level() > state.0.level_for(record.target()) {
                return;
            }
            state.1
        };
        let line = match format {
            LogFormat::Text => text_line(record),
            LogFormat::Json => json_line(record, SystemTime::now()),
        };
        // One write per line: lines of different threads never interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

fn text_line(record: &Record<'_>) -> String {
    match record.level() {
        Level::Info => format!("{}\n", record.args()),
        Level::Warn => format!("warning: {}\n", record.args()),
        Level::Error => format!("error: {}\n", record.args()),
        level => format!(
            "{}: {}: {}\n",
            level.as_str().to_ascii_lowercase(),
            record.target(),
            record.args()
        ),
    }
}

fn json_line(record: &Record<'_>, now: SystemTime) -> String {
    let thread = std::thread::current();
    let quoted = |text: &str| serde_json::Value::from(text).to_string();
    // Keys in a fixed order, the time first (serde_json's maps sort them).
    format!(
        "{{\"ts\":\"{}\",\"level\":\"{}\",\"target\":{},\"thread\":{},\"msg\":{}}}\n",
        rfc3339(now),
        record.level().as_str().to_ascii_lowercase(),
        quoted(record.target()),
        quoted(thread.name().unwrap_or("")),
        quoted(&record.args().to_string()),
    )
}

/// `2026-11-26T01:02:03.456Z`.
fn rfc3339(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Install the logger (once, at the start of `main`): `RINGWAY_LOG` or `info`, text.
pub(crate) fn init() {
    if let Ok(spec) = std::env::var("RINGWAY_LOG") {
        if let Err(e) = set_spec(&spec) {
            eprintln!("ringway: RINGWAY_LOG ignored: {e}");
        }
    }
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(current_filter().max());
    }
}

fn current_filter() -> Filter {
    LOGGER
        .state
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .0
        .clone()
}

/// Replace the levels with `spec`; the spec as understood, or why not.
pub(crate) fn set_spec(spec: &str) -> Result<String, String> {
    let filter = Filter::parse(spec)?;
    let text = filter.to_string();
    let max = filter.max();
    LOGGER.state.write().unwrap_or_else(|e| e.into_inner()).0 = filter;
    log::set_max_level(max);
    Ok(text)
}

/// The levels in force, as a spec.
pub(crate) fn current_spec() -> String {
    current_filter().to_string()
}

fn set_format(format: LogFormat) {
    LOGGER.state.write().unwrap_or_else(|e| e.into_inner()).1 = format;
}

/// The management API's `GET`/`PUT /log-level`: `None` reads, `Some(spec)` sets.
pub(crate) fn manage_hook(spec: Option<&str>) -> Result<String, String> {
    match spec {
        None => Ok(current_spec()),
        Some(spec) => set_spec(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_specs() {
        let f = Filter::parse("warn,ringway_server=info,ringway_server::sip=trace").unwrap();
        assert_eq!(f.level_for("ringway_server::sip::tcp"), LevelFilter::Trace);
        assert_eq!(f.level_for("ringway_server::sipx"), LevelFilter::Info);
        assert_eq!(f.level_for("ringway_server"), LevelFilter::Info);
        assert_eq!(f.level_for("ringway_sip"), LevelFilter::Warn);
        assert_eq!(f.max(), LevelFilter::Trace);
        assert_eq!(
            f.to_string(),
            "warn,ringway_server=info,ringway_server::sip=trace"
        );
        assert_eq!(
            Filter::parse("ringway_sip=debug").unwrap().to_string(),
            "info,ringway_sip=debug"
        );
        assert_eq!(Filter::parse("").unwrap().to_string(), "info");
        for bad in ["loud", "ringway_sip=loud", "=debug", "a b=info"] {
            assert!(Filter::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_lines_are_one_object() {
        let record = Record::builder()
            .level(Level::Warn)
            .target("ringway_server::sip")
            .args(format_args!("two\nlines \"quoted\""))
            .build();
        let at = UNIX_EPOCH + std::time::Duration::from_millis(1_795_568_523_456);
        let line = json_line(&record, at);
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["target"], "ringway_server::sip");
        assert_eq!(v["msg"], "two\nlines \"quoted\"");
        assert_eq!(v["ts"], "2026-11-25T01:02:03.456Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + std::time::Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
