//! Configuration files (TOML) for `ringway sip proxy` and `ringway sfu
//! serve`, and `ringway config check FILE`.
//!
//! A file has one table per command, `[sip.proxy]`, `[sip.dispatch]` and
//! `[sfu.serve]`,
//! whose keys are the command's long options without the dashes
//! (`max-transactions = 1000`, `route-to = "127.0.0.1:5080"`); a flag is
//! `true`/`false`, a repeatable option an array (`domain = ["a", "b"]`).
//! Every option of the command line can be written there (the options are
//! read from the clap command itself, so a new option is a new key). The
//! file's keys become command-line arguments placed before the real ones,
//! and a key whose option is also on the command line is left out: the
//! command line overrides the file. Relative paths of file options
//! (`auth-file`) are relative to the configuration file.
//!
//! Errors name the file, the line and the key, on one line: an unknown
//! table or key, a value of the wrong type, a value the option's parser
//! refuses, or one the command's validation refuses.

use super::sfu::serve::ServeArgs;
use super::sip_dispatch::DispatchArgs;
use super::sip_proxy::ProxyArgs;
use clap::{ArgAction, ArgMatches, Command, FromArgMatches, ValueHint};
use ringway_server::sfu::SfuServerConfig;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use toml::de::{DeTable, DeValue};

/// `ringway config` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum ConfigCmd {
    /// Check a configuration file: every table and key known, every value
    /// accepted by its option and by the command's validation.
    Check {
        /// The TOML file.
        file: PathBuf,
    },
}

/// Run a `ringway config` subcommand.
pub(crate) fn run(c: ConfigCmd, root: &Command) -> anyhow::Result<()> {
    match c {
        ConfigCmd::Check { file } => {
            let summary = check_file(&file, root).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{}: ok ({summary})", file.display());
            Ok(())
        }
    }
}

/// A command that reads a table of the file.
struct Section {
    /// Table name, e.g. `sip.proxy`.
    table: &'static str,
    /// Subcommand path, e.g. `["sip", "proxy"]`.
    path: [&'static str; 2],
    /// The command's own validation of parsed arguments.
    validate: fn(&ArgMatches) -> anyhow::Result<()>,
}

fn validate_proxy(matches: &ArgMatches) -> anyhow::Result<()> {
    super::sip_proxy::checked_config(&ProxyArgs::from_arg_matches(matches)?)?;
    Ok(())
}

fn validate_dispatch(matches: &ArgMatches) -> anyhow::Result<()> {
    super::sip_dispatch::checked_config(&DispatchArgs::from_arg_matches(matches)?)?;
    Ok(())
}

fn validate_serve(matches: &ArgMatches) -> anyhow::Result<()> {
    SfuServerConfig::try_from(&ServeArgs::from_arg_matches(matches)?)?.validate()?;
    Ok(())
}

const SECTIONS: [Section; 3] = [
    Section {
        table: "sip.proxy",
        path: ["sip", "proxy"],
        validate: validate_proxy,
    },
    Section {
        table: "sip.dispatch",
        path: ["sip", "dispatch"],
        validate: validate_dispatch,
    },
    Section {
        table: "sfu.serve",
        path: ["sfu", "serve"],
        validate: validate_serve,
    },
];

/// Options that cannot be set in a file.
const NOT_IN_FILES: [&str; 3] = ["config", "help", "version"];

/// A configuration error, one line: `FILE[:LINE]: message`.
#[derive(Debug)]
pub(crate) struct ConfigError(String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// One key of a table as command-line arguments.
#[derive(Debug)]
struct FileArg {
    key: String,
    line: usize,
    args: Vec<OsString>,
}

/// A parsed file.
struct File {
    path: PathBuf,
    text: String,
}

impl File {
    fn read(path: &Path) -> Result<File, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: cannot read: {e}", path.display())))?;
        Ok(File {
            path: path.to_path_buf(),
            text,
        })
    }

    /// 1-based line of byte offset `at`.
    fn line(&self, at: usize) -> usize {
        self.text[..at.min(self.text.len())].matches('\n').count() + 1
    }

    fn error(&self, at: Option<usize>, message: impl std::fmt::Display) -> ConfigError {
        match at {
            Some(at) => ConfigError(format!(
                "{}:{}: {message}",
                self.path.display(),
                self.line(at)
            )),
            None => ConfigError(format!("{}: {message}", self.path.display())),
        }
    }

    fn parse(&self) -> Result<DeTable<'_>, ConfigError> {
        DeTable::parse(&self.text)
            .map(|table| table.into_inner())
            .map_err(|e| {
                let message = e
                    .message()
                    .lines()
                    .next()
                    .unwrap_or("invalid TOML")
                    .to_string();
                self.error(e.span().map(|s| s.start), message)
            })
    }

    /// The tables of the file that commands read, each checked for unknown
    /// tables and keys against `root`'s subcommands.
    fn sections(
        &self,
        root: &Command,
    ) -> Result<Vec<(&'static Section, Vec<FileArg>)>, ConfigError> {
        let top = self.parse()?;
        let mut found = Vec::new();
        for (name, value) in &top {
            let span = Some(name.span().start);
            let DeValue::Table(commands) = value.get_ref() else {
                return Err(self.error(
                    span,
                    format!(
                        "`{}` is not a table: use [sip.proxy], [sip.dispatch] or [sfu.serve]",
                        name.get_ref()
                    ),
                ));
            };
            for (command, keys) in commands {
                let table = format!("{}.{}", name.get_ref(), command.get_ref());
                let span = Some(command.span().start);
                let Some(section) = SECTIONS.iter().find(|s| s.table == table) else {
                    return Err(self.error(
                        span,
                        format!("unknown table [{table}] (known: [sip.proxy], [sip.dispatch], [sfu.serve])"),
                    ));
                };
                let DeValue::Table(keys) = keys.get_ref() else {
                    return Err(self.error(span, format!("[{table}] is not a table")));
                };
                let command = subcommand(root, &section.path);
                found.push((section, self.file_args(section, &command, keys)?));
            }
        }
        Ok(found)
    }

    /// The keys of one table as arguments of `command`, each parsed alone
    /// by the command's own parser.
    fn file_args(
        &self,
        section: &Section,
        command: &Command,
        keys: &DeTable<'_>,
    ) -> Result<Vec<FileArg>, ConfigError> {
        let mut out = Vec::new();
        for (key, value) in keys {
            let name = key.get_ref().as_ref();
            let span = Some(key.span().start);
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_long() == Some(name) && !NOT_IN_FILES.contains(&name));
            let Some(arg) = arg else {
                let hint = if NOT_IN_FILES.contains(&name) {
                    "cannot be set in a file".to_string()
                } else {
                    format!("see `ringway {} --help`", section.path.join(" "))
                };
                return Err(self.error(
                    span,
                    format!("[{}] unknown key `{name}` ({hint})", section.table),
                ));
            };
            let file_path = arg.get_value_hint() == ValueHint::FilePath;
            let scalar = |value: &DeValue<'_>| -> Result<String, String> {
                let text = match value {
                    DeValue::String(s) => s.to_string(),
                    DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix())
                        .map(|v| v.to_string())
                        .map_err(|_| "integer out of range".to_string())?,
                    DeValue::Float(f) => f.as_str().to_string(),
                    DeValue::Boolean(b) => b.to_string(),
                    _ => return Err("expects a string, number or boolean".into()),
                };
                Ok(if file_path {
                    self.relative(&text)
                } else {
                    text
                })
            };
            let flag = format!("--{name}");
            let args: Result<Vec<OsString>, String> = match (arg.get_action(), value.get_ref()) {
                (ArgAction::SetTrue, DeValue::Boolean(true)) => Ok(vec![flag.into()]),
                (ArgAction::SetTrue, DeValue::Boolean(false)) => Ok(Vec::new()),
                (ArgAction::SetTrue, _) => Err("expects true or false".into()),
                (ArgAction::Append, DeValue::Array(items)) => items
                    .iter()
                    .map(|item| scalar(item.get_ref()).map(|v| format!("{flag}={v}").into()))
                    .collect(),
                (_, DeValue::Array(_)) => Err("expects one value, not a list".into()),
                (_, value) => scalar(value).map(|v| vec![format!("{flag}={v}").into()]),
            };
            let args = args.map_err(|error| {
                self.error(span, format!("[{}] {name}: {error}", section.table))
            })?;
            // The option's own parser, on this key alone.
            let mut argv: Vec<OsString> = vec![section.path.join(" ").into()];
            argv.extend(args.iter().cloned());
            if let Err(error) = command.clone().try_get_matches_from(argv) {
                let rendered = error.to_string();
                let first = rendered
                    .lines()
                    .next()
                    .unwrap_or("invalid value")
                    .trim_start_matches("error: ");
                return Err(self.error(span, format!("[{}] {name}: {first}", section.table)));
            }
            out.push(FileArg {
                key: name.to_string(),
                line: self.line(key.span().start),
                args,
            });
        }
        Ok(out)
    }

    /// A path from the file, relative to the file's directory.
    fn relative(&self, value: &str) -> String {
        let path = Path::new(value);
        if path.is_absolute() {
            return value.to_string();
        }
        let dir = self.path.parent().unwrap_or(Path::new(""));
        dir.join(path).display().to_string()
    }

    /// Validate `args` (after the subcommand path) with the section's
    /// validation; on failure, name the file key whose value alone fails
    /// the same way (its line), else just the file.
    fn validate(
        &self,
        section: &Section,
        command: &Command,
        file_args: &[FileArg],
        args: &[OsString],
    ) -> Result<(), ConfigError> {
        let parse = |args: &[OsString]| {
            let mut argv: Vec<OsString> = vec![section.path.join(" ").into()];
            argv.extend(args.iter().cloned());
            command.clone().try_get_matches_from(argv)
        };
        let Ok(matches) = parse(args) else {
            // Parse errors of the command line are clap's to report.
            return Ok(());
        };
        let Err(error) = (section.validate)(&matches) else {
            return Ok(());
        };
        let message = error.to_string();
        let fails_the_same = |args: &[OsString]| match parse(args) {
            Ok(m) => (section.validate)(&m).is_err_and(|e| e.to_string() == message),
            Err(_) => false,
        };
        for file_arg in file_args {
            // The key to blame fails that way alone, and the rest passes
            // without it (a key that merely does not supply what another
            // lacks, e.g. `listen` next to `proxy = []`, is not named).
            let mut without = args.to_vec();
            for arg in &file_arg.args {
                if let Some(index) = without.iter().position(|a| a == arg) {
                    without.remove(index);
                }
            }
            if fails_the_same(&file_arg.args) && !fails_the_same(&without) {
                return Err(ConfigError(format!(
                    "{}:{}: [{}] {}: {message}",
                    self.path.display(),
                    file_arg.line,
                    section.table,
                    file_arg.key
                )));
            }
        }
        Err(self.error(None, format!("[{}] {message}", section.table)))
    }
}

/// The subcommand at `path` of `root` (built, so its arguments are final).
fn subcommand(root: &Command, path: &[&'static str; 2]) -> Command {
    let mut root = root.clone();
    root.build();
    root.find_subcommand(path[0])
        .and_then(|c| c.find_subcommand(path[1]))
        .cloned()
        .unwrap_or_else(|| Command::new(path[1]))
}

/// `ringway config check FILE`: a summary of what the file sets.
fn check_file(path: &Path, root: &Command) -> Result<String, ConfigError> {
    let file = File::read(path)?;
    let sections = file.sections(root)?;
    if sections.is_empty() {
        return Err(file.error(None, "no [sip.proxy], [sip.dispatch] or [sfu.serve] table"));
    }
    let mut summary = Vec::new();
    for (section, file_args) in &sections {
        let command = subcommand(root, &section.path);
        let args: Vec<OsString> = file_args.iter().flat_map(|a| a.args.clone()).collect();
        file.validate(section, &command, file_args, &args)?;
        summary.push(format!("[{}] {} keys", section.table, file_args.len()));
    }
    Ok(summary.join(", "))
}

/// The long option names given on a command line (`--name` or `--name=`).
fn given_options(args: &[OsString]) -> Vec<String> {
    args.iter()
        .filter_map(|a| a.to_str())
        .take_while(|a| *a != "--")
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect()
}

/// The value of `--config` on a command line.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_str()?;
        if text == "--" {
            return None;
        }
        if text == "--config" {
            return iter.next().map(PathBuf::from);
        }
        if let Some(value) = text.strip_prefix("--config=") {
            return Some(PathBuf::from(value));
        }
    }
    None
}

/// The command line with the configuration file's options of its command
/// inserted before its own (`argv` unchanged without `--config`).
pub(crate) fn expand_args(
    argv: Vec<OsString>,
    root: &Command,
) -> Result<Vec<OsString>, ConfigError> {
    let Some(section) = SECTIONS
        .iter()
        .find(|s| argv.len() > 2 && argv[1] == s.path[0] && argv[2] == s.path[1])
    else {
        return Ok(argv);
    };
    let own = &argv[3..];
    let Some(path) = config_path(own) else {
        return Ok(argv);
    };
    let file = File::read(&path)?;
    let sections = file.sections(root)?;
    let given = given_options(own);
    let file_args: Vec<FileArg> = sections
        .into_iter()
        .filter(|(s, _)| s.table == section.table)
        .flat_map(|(_, args)| args)
        .filter(|a| !given.contains(&a.key))
        .collect();
    let mut merged: Vec<OsString> = file_args.iter().flat_map(|a| a.args.clone()).collect();
    merged.extend(own.iter().cloned());
    let command = subcommand(root, &section.path);
    file.validate(section, &command, &file_args, &merged)?;
    let mut out = argv[..3].to_vec();
    out.extend(merged);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::parser::ValueSource;
    use clap::CommandFactory;

    fn root() -> Command {
        crate::Cli::command()
    }

    /// The documented sample (docs/ringway.toml).
    fn sample() -> (PathBuf, String) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ringway.toml");
        let text = std::fs::read_to_string(&path).expect("docs/ringway.toml");
        (path, text)
    }

    /// `key = value` of the sample's table `table`, commented out or not.
    fn sample_value(text: &str, table: &str, key: &str) -> Option<String> {
        let mut in_table = false;
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                in_table = line == format!("[{table}]");
                continue;
            }
            let line = line.trim_start_matches('#').trim();
            if !in_table {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == key {
                    // A trailing `# comment` is not part of the value
                    // (quoted values keep theirs: a `#` may sit inside).
                    let value = v.trim();
                    let value = match value.split_once(" #") {
                        Some((bare, _)) if !value.starts_with('"') => bare.trim_end(),
                        _ => value,
                    };
                    return Some(value.to_string());
                }
            }
        }
        None
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// Every option of `sip proxy` and `sfu serve` has a key: the sample
    /// documents it, and the key set to the sample's value reaches the
    /// option as if it had been given on the command line.
    #[test]
    fn every_option_has_a_documented_key() {
        let root = root();
        let (_, text) = sample();
        let dir = tempfile::tempdir().unwrap();
        for section in &SECTIONS {
            let command = subcommand(&root, &section.path);
            let mut checked = 0;
            for arg in command.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                // Hidden options are test knobs, not for service: the
                // sample does not document them.
                if NOT_IN_FILES.contains(&long) || arg.is_hide_set() {
                    continue;
                }
                let value = sample_value(&text, section.table, long).unwrap_or_else(|| {
                    panic!("docs/ringway.toml [{}] has no key `{long}`", section.table)
                });
                let path = write(
                    dir.path(),
                    "one.toml",
                    &format!("[{}]\n{long} = {value}\n", section.table),
                );
                // Parsed by the option's parser, not validated: some
                // options are only valid with others (xdp-iface, priority).
                let file = File::read(&path).unwrap();
                let sections = file
                    .sections(&root)
                    .unwrap_or_else(|e| panic!("[{}] {long} = {value}: {e}", section.table));
                let mut line = argv(&["ringway", section.path[0], section.path[1]]);
                line.extend(sections[0].1.iter().flat_map(|a| a.args.clone()));
                let matches = root.clone().try_get_matches_from(line).unwrap();
                let (_, sub) = matches.subcommand().unwrap();
                let (_, sub) = sub.subcommand().unwrap();
                let id = arg.get_id().as_str();
                let set = sub.value_source(id) == Some(ValueSource::CommandLine);
                // `false` for a flag is its default: nothing to pass.
                assert!(
                    set || value == "false",
                    "[{}] {long} = {value} did not set --{long}",
                    section.table
                );
                checked += 1;
            }
            assert!(checked > 10, "{}: {checked} options", section.table);
        }
    }

    #[test]
    fn the_sample_checks_and_unknown_keys_and_bad_values_name_file_line_key() {
        let root = root();
        let (path, _) = sample();
        let summary = check_file(&path, &root).unwrap();
        assert!(
            summary.contains("[sip.proxy]") && summary.contains("[sfu.serve]"),
            "{summary}"
        );
        let dir = tempfile::tempdir().unwrap();
        for (text, want) in [
            (
                "[sip.proxy]\nworkers = 2\nwrokers = 3\n",
                ":3: [sip.proxy] unknown key `wrokers`",
            ),
            (
                "[sip.proxy]\n\nmode = \"fast\"\n",
                ":3: [sip.proxy] mode: invalid value 'fast'",
            ),
            (
                "[sip.proxy]\nworkers = \"two\"\n",
                ":2: [sip.proxy] workers: invalid value 'two'",
            ),
            (
                "[sip.proxy]\nworkers = 0\n",
                ":2: [sip.proxy] workers: invalid configuration: workers must be 1..=256",
            ),
            (
                "[sip.proxy]\nregistrar = \"yes\"\n",
                ":2: [sip.proxy] registrar: expects true or false",
            ),
            (
                "[sip.proxy]\nworkers = [1]\n",
                ":2: [sip.proxy] workers: expects one value",
            ),
            (
                "[sip.proxy]\nconfig = \"x.toml\"\n",
                ":2: [sip.proxy] unknown key `config` (cannot be set in a file)",
            ),
            ("[sip.porxy]\n", ":1: unknown table [sip.porxy]"),
            ("[sip.proxy]\nworkers = \n", ":2:"),
            (
                "[sfu.serve]\nmax-clients = -1\n",
                ":2: [sfu.serve] max-clients: invalid value '-1'",
            ),
            (
                "[sip.proxy]\npriority = 5\n",
                ":2: [sip.proxy] priority: --priority needs --policy",
            ),
        ] {
            let file = write(dir.path(), "bad.toml", text);
            let error = check_file(&file, &root).unwrap_err().to_string();
            assert!(error.starts_with(&file.display().to_string()), "{error}");
            assert!(error.contains(want), "{text:?}: {error}");
            assert_eq!(error.lines().count(), 1, "{error}");
        }
        // A key that only fails to supply what another lacks is not named:
        // the file as a whole lacks a proxy.
        let file = write(
            dir.path(),
            "dispatch.toml",
            "[sip.dispatch]\nlisten = \"127.0.0.1:5070\"\nproxy = []\n",
        );
        let error = check_file(&file, &root).unwrap_err().to_string();
        assert!(error.contains("[sip.dispatch]"), "{error}");
        assert!(!error.contains("listen:"), "{error}");
        // A combination the file's keys are fine with one by one.
        let file = write(
            dir.path(),
            "ok.toml",
            "[sip.proxy]\npolicy = \"fifo\"\npriority = 5\n",
        );
        assert!(check_file(&file, &root).is_ok());
    }

    #[test]
    fn command_line_overrides_the_file_and_paths_are_relative_to_it() {
        let root = root();
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "r.toml",
            "[sip.proxy]\nworkers = 2\ndomain = [\"a.test\", \"b.test\"]\nauth = true\nauth-file = \"users.htdigest\"\n",
        );
        let file = file.display().to_string();
        let parse = |extra: &[&str]| {
            let mut line = argv(&["ringway", "sip", "proxy", "--config", &file]);
            line.extend(argv(extra));
            let expanded = expand_args(line, &root).unwrap();
            let matches = root.clone().try_get_matches_from(expanded).unwrap();
            let (_, sip) = matches.subcommand().unwrap();
            let (_, proxy) = sip.subcommand().unwrap();
            ProxyArgs::from_arg_matches(proxy).unwrap()
        };
        let a = parse(&[]);
        assert_eq!(a.workers, 2);
        assert_eq!(a.domains, ["a.test", "b.test"]);
        assert!(a.auth);
        assert_eq!(a.auth_file, Some(dir.path().join("users.htdigest")));
        let a = parse(&["--workers", "3", "--domain=c.test"]);
        assert_eq!(a.workers, 3);
        assert_eq!(a.domains, ["c.test"]);
        // Without --config nothing changes.
        let line = argv(&["ringway", "sip", "proxy", "--workers", "4"]);
        assert_eq!(expand_args(line.clone(), &root).unwrap(), line);
        // The SFU reads its own table only.
        let sfu = write(
            dir.path(),
            "s.toml",
            "[sfu.serve]\nmax-clients = 7\n[sip.proxy]\nworkers = 9\n",
        );
        let line = argv(&[
            "ringway",
            "sfu",
            "serve",
            "--config",
            &sfu.display().to_string(),
        ]);
        let expanded = expand_args(line, &root).unwrap();
        assert!(expanded.contains(&OsString::from("--max-clients=7")));
        assert!(!expanded
            .iter()
            .any(|a| a.to_str().unwrap().contains("workers")));
    }
}
