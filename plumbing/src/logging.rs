//! The logging flags every fgpu binary takes, and the subscriber they install.
//!
//! `--log-format text|json` (env `FGPU_LOG_FORMAT`) and `--log-level FILTER` (env
//! `FGPU_LOG_LEVEL`, tracing's EnvFilter syntax; without it `RUST_LOG`, without that
//! `info`). Logs go to stderr; standard output stays for what a command prints.

use tracing_subscriber::EnvFilter;

use crate::exit::BadInput;

/// Log line formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags; flatten into a binary's top-level parser.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct LogArgs {
    /// Log line format on stderr: human-readable `text`, or one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "FGPU_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Log filter, e.g. `info`, `debug` or `fgpu_driver=debug,info` (tracing EnvFilter
    /// syntax). Without it, RUST_LOG is used, and without that, `info`.
    #[arg(long, global = true, value_name = "FILTER", env = "FGPU_LOG_LEVEL")]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// The filter these flags ask for; a bad `--log-level` is [`BadInput`] naming the flag.
    pub fn filter(&self) -> Result<EnvFilter, BadInput> {
        match self.log_level.as_deref() {
            Some(spec) => EnvFilter::try_new(spec).map_err(|e| {
                BadInput::new(format!(
                    "--log-level {spec:?}: {e} (e.g. info, debug, fgpu_driver=debug)"
                ))
            }),
            None => {
                Ok(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
            }
        }
    }

    /// Installs the process's subscriber (stderr; colours only on a terminal).
    pub fn init(&self) -> Result<(), BadInput> {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(self.filter()?)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        let installed = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        };
        installed.map_err(|e| BadInput::new(format!("cannot install the log subscriber: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_level_names_the_flag() {
        let args = LogArgs {
            log_format: LogFormat::Text,
            log_level: Some("info,=,[".into()),
        };
        let e = args.filter().unwrap_err().to_string();
        assert!(e.starts_with("--log-level \"info,=,[\""), "{e}");
    }

    #[test]
    fn a_good_level_is_taken() {
        let args = LogArgs {
            log_format: LogFormat::Json,
            log_level: Some("fgpu_driver=debug,warn".into()),
        };
        assert_eq!(args.filter().unwrap().to_string(), "fgpu_driver=debug,warn");
    }
}
