//! The configuration of a process: the file (`--config FILE`, else the file [`CONFIG_ENV`] names, else the
//! built-in defaults), then the command-line flags over it ([`Overrides`]). Flags win over the file, the
//! file wins over the defaults (docs/CONFIGURATION.md, "Using the file").

use std::path::{Path, PathBuf};

use turnstile_config::{CONFIG_ENV, Config};

use crate::NodeError;

/// The file to read: `explicit` (`--config`), else the non-empty value of [`CONFIG_ENV`], else none.
pub fn config_path(explicit: Option<&Path>) -> Option<PathBuf> {
    explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty()).map(PathBuf::from))
}

/// Reads and validates the configuration file [`config_path`] finds, or the defaults without one. A file
/// that is missing, unreadable or refused is an error naming the file, and for a bad key its line, column
/// and key path.
pub fn load(explicit: Option<&Path>) -> Result<Loaded, NodeError> {
    let path = config_path(explicit);
    let config = Config::load_or_default(path.as_deref())?;
    Ok(Loaded { config, path })
}

/// A configuration and the file it came from.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub config: Config,
    /// `None`: no file, the built-in defaults.
    pub path: Option<PathBuf>,
}

impl Loaded {
    /// How the banner names it: the file and its agents, or that there is none.
    pub fn describe(&self) -> String {
        match &self.path {
            Some(path) => format!(
                "{} (agents: {}; default {})",
                path.display(),
                self.config.agent_names(),
                self.config.default_agent
            ),
            None => "none (built-in defaults; pass --config FILE)".to_owned(),
        }
    }
}

/// The command-line flags that override keys of the file; `None` is "not given", so the file's value (or
/// the default) stays.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--partitions`: `cluster.partitions`.
    pub partitions: Option<u32>,
    /// `--replicas`: `cluster.replicas`.
    pub replicas: Option<u32>,
    /// `--shards`: `cluster.shards`.
    pub shards: Option<u32>,
    /// `--lease-ttl-ms`: `cluster.lease_ttl_ms`.
    pub lease_ttl_ms: Option<u64>,
    /// `--renew-ms`: `cluster.renew_ms`.
    pub renew_ms: Option<u64>,
    /// `--drain-timeout-ms`: `cluster.drain_timeout_ms`.
    pub drain_timeout_ms: Option<u64>,
    /// `--route-deadline-ms`: `cluster.route_deadline_ms`.
    pub route_deadline_ms: Option<u64>,
}

impl Overrides {
    /// Sets every given flag's key in `config` and validates the result. A combination the flags made
    /// invalid is refused naming the flags (and the keys of the file they were combined with).
    pub fn apply(&self, config: &mut Config) -> Result<(), NodeError> {
        let c = &mut config.cluster;
        set(&mut c.partitions, self.partitions);
        set(&mut c.replicas, self.replicas);
        set(&mut c.shards, self.shards);
        set(&mut c.lease_ttl_ms, self.lease_ttl_ms);
        set(&mut c.renew_ms, self.renew_ms);
        set(&mut c.drain_timeout_ms, self.drain_timeout_ms);
        set(&mut c.route_deadline_ms, self.route_deadline_ms);
        if (self.renew_ms.is_some() || self.lease_ttl_ms.is_some()) && c.renew_ms >= c.lease_ttl_ms {
            return Err(NodeError::Flags(format!(
                "{} must be below {}, or leases lapse between renewals; try a third of it",
                named(self.renew_ms, "--renew-ms", "cluster.renew_ms", c.renew_ms),
                named(self.lease_ttl_ms, "--lease-ttl-ms", "cluster.lease_ttl_ms", c.lease_ttl_ms)
            )));
        }
        if self.renew_ms.is_some() && c.worker_ttl_ms <= c.renew_ms {
            return Err(NodeError::Flags(format!(
                "--renew-ms {} must be below cluster.worker_ttl_ms {} (the configuration's, default 3000), or live \
                 workers drop out between heartbeats; set worker_ttl_ms to several times it",
                c.renew_ms, c.worker_ttl_ms
            )));
        }
        if (self.shards.is_some() || self.partitions.is_some()) && c.shards < c.partitions {
            return Err(NodeError::Flags(format!(
                "{} is below {}; every partition needs at least one shard",
                named(self.shards, "--shards", "cluster.shards", c.shards),
                named(self.partitions, "--partitions", "cluster.partitions", c.partitions)
            )));
        }
        config.validate()?;
        Ok(())
    }
}

fn set<T: Copy>(key: &mut T, flag: Option<T>) {
    if let Some(value) = flag {
        *key = value;
    }
}

/// `FLAG VALUE` when the flag was given, else `KEY VALUE` (the file's key or its default), as a refusal
/// names a setting.
fn named<T: std::fmt::Display>(given: Option<T>, flag: &str, key: &str, value: T) -> String {
    format!("{} {value}", if given.is_some() { flag } else { key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_absent_flags_keep_it() {
        let mut config =
            Config::from_toml_str("[cluster]\nlease_ttl_ms = 3000\nrenew_ms = 900\nshards = 64\n").unwrap();
        let flags = Overrides { renew_ms: Some(500), ..Overrides::default() };
        flags.apply(&mut config).unwrap();
        assert_eq!((config.cluster.lease_ttl_ms, config.cluster.renew_ms, config.cluster.shards), (3000, 500, 64));
    }

    /// The refusal of `flags` over the configuration `toml`.
    fn refusal(toml: &str, flags: Overrides) -> String {
        let mut config = Config::from_toml_str(toml).unwrap();
        flags.apply(&mut config).unwrap_err().to_string()
    }

    #[test]
    fn a_renewal_the_flags_make_too_slow_names_the_flags() {
        assert_eq!(
            refusal("", Overrides { renew_ms: Some(500), lease_ttl_ms: Some(400), ..Overrides::default() }),
            "--renew-ms 500 must be below --lease-ttl-ms 400, or leases lapse between renewals; try a third of it"
        );
        assert_eq!(
            refusal("[cluster]\nlease_ttl_ms = 1000\n", Overrides { renew_ms: Some(1000), ..Overrides::default() }),
            "--renew-ms 1000 must be below cluster.lease_ttl_ms 1000, or leases lapse between renewals; try a \
             third of it"
        );
        let flags = Overrides { renew_ms: Some(4000), lease_ttl_ms: Some(20_000), ..Overrides::default() };
        assert!(refusal("", flags).starts_with("--renew-ms 4000 must be below cluster.worker_ttl_ms 3000"));
    }

    #[test]
    fn fewer_shards_than_partitions_names_the_flag() {
        assert_eq!(
            refusal("", Overrides { partitions: Some(8), shards: Some(4), ..Overrides::default() }),
            "--shards 4 is below --partitions 8; every partition needs at least one shard"
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = load(Some(Path::new("/nonexistent/turnstile.toml"))).unwrap_err().to_string();
        assert!(err.starts_with("/nonexistent/turnstile.toml: cannot read the configuration file: "), "{err}");
    }

    #[test]
    fn a_file_names_itself_and_no_file_is_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "[limits]\nmax_pending = 5\n").unwrap();
        let loaded = load(Some(&path)).unwrap();
        assert_eq!(loaded.config.limits.max_pending, 5);
        assert_eq!(loaded.describe(), format!("{} (agents: scripted; default scripted)", path.display()));
        assert!(Loaded::default().describe().starts_with("none"));
    }
}
