//! The series every Prometheus client exports by convention and the `metrics` facade cannot express (a
//! constant info gauge with labels, float counters read from the kernel at scrape time):
//! `turnstile_build_info{version,commit}` and the standard `process_*` metrics, appended to each scrape.
//!
//! The process figures come from Linux's `/proc/self`; elsewhere (or if `/proc` is not mounted) they are
//! left out rather than reported as zero.

use std::fmt::Write as _;
use std::sync::OnceLock;

use crate::names;

/// What the running binary was built from: shown by `turnstile_build_info` so a rollout can be followed
/// in Prometheus (`count by (version, commit) (turnstile_build_info)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The crate version, e.g. `0.1.0`.
    pub version: &'static str,
    /// The git commit, or `unknown` when the build had none (a source tarball without `TURNSTILE_COMMIT`).
    pub commit: &'static str,
}

/// The build of a process that never called [`set_build_info`] (a library test): this crate's version,
/// which is the workspace's, and no commit.
const UNKNOWN_BUILD: BuildInfo = BuildInfo { version: env!("CARGO_PKG_VERSION"), commit: "unknown" };

static BUILD: OnceLock<BuildInfo> = OnceLock::new();

/// Records what this binary was built from; the binary calls it first thing. Later calls are ignored (one
/// binary, one build).
pub fn set_build_info(info: BuildInfo) {
    let _ = BUILD.set(info);
}

/// The build [`set_build_info`] recorded, else the workspace version with commit `unknown`.
pub fn build_info() -> BuildInfo {
    BUILD.get().copied().unwrap_or(UNKNOWN_BUILD)
}

/// Appends `turnstile_build_info` and the `process_*` series to a Prometheus text exposition.
pub(crate) fn render(out: &mut String) {
    let build = build_info();
    header(out, names::BUILD_INFO, "gauge", "The version and commit this server was built from (always 1).");
    let _ = writeln!(
        out,
        "{}{{version=\"{}\",commit=\"{}\"}} 1",
        names::BUILD_INFO,
        escape(build.version),
        escape(build.commit)
    );
    if let Some(p) = ProcessStats::read() {
        p.render(out);
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// `/proc` counts CPU time and start time in USER_HZ ticks, which Linux fixes at 100 for user space on
/// every architecture Turnstile ships for (x86-64, arm64), whatever the kernel's own HZ; Prometheus's Go
/// client (`procfs`) assumes the same.
const USER_HZ: f64 = 100.0;

/// One reading of this process's figures from `/proc/self`.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    start_time_seconds: f64,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
}

impl ProcessStats {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot_time = std::fs::read_to_string("/proc/stat").ok().as_deref().and_then(boot_time)?;
        let mut stats = parse_stat(&stat, boot_time)?;
        // VmRSS is in KiB whatever the page size (4 KiB, or 16/64 KiB on some arm64 kernels).
        stats.resident_bytes = std::fs::read_to_string("/proc/self/status").ok().as_deref().and_then(resident_bytes)?;
        // Each entry of /proc/self/fd is one open descriptor (the directory handle reading it included,
        // as every Prometheus client counts it).
        stats.open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64);
        stats.max_fds = std::fs::read_to_string("/proc/self/limits").ok().as_deref().and_then(max_open_files);
        Some(stats)
    }

    fn render(&self, out: &mut String) {
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            header(out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        };
        one(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            self.cpu_seconds.to_string(),
        );
        one(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            self.resident_bytes.to_string(),
        );
        one("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", self.virtual_bytes.to_string());
        one(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            self.start_time_seconds.to_string(),
        );
        if let Some(fds) = self.open_fds {
            one("process_open_fds", "gauge", "Number of open file descriptors.", fds.to_string());
        }
        if let Some(max) = self.max_fds {
            one("process_max_fds", "gauge", "Maximum number of open file descriptors.", max.to_string());
        }
    }
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// The figures of `/proc/self/stat` (proc(5)): the fields after the command name, which is in parentheses
/// and may itself hold spaces and parentheses, hence the split at the last `)`.
fn parse_stat(stat: &str, boot_time: f64) -> Option<ProcessStats> {
    let (_, rest) = stat.rsplit_once(')')?;
    // rest[0] is field 3 (state), so field N is rest[N - 3].
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let (utime, stime, start, vsize) = (field(14)?, field(15)?, field(22)?, field(23)?);
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / USER_HZ,
        virtual_bytes: vsize,
        start_time_seconds: boot_time + start as f64 / USER_HZ,
        ..ProcessStats::default()
    })
}

/// `VmRSS` of `/proc/self/status`, in bytes.
fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// The soft limit of `Max open files` in `/proc/self/limits`; `None` when unlimited.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_last_parenthesis() {
        // A command name with a space and a parenthesis, as a process may name itself.
        let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 130 0 0 20 0 9 0 \
                    123400 1048576000 2560 18446744073709551615 1 1 0 0 0 0 0 4096 17991 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(stat, 1_700_000_000.0).unwrap();
        assert_eq!(s.cpu_seconds, 3.8);
        assert_eq!(s.start_time_seconds, 1_700_000_000.0 + 1234.0);
        assert_eq!(s.virtual_bytes, 1_048_576_000);
        assert_eq!(parse_stat("4242 (truncated) S 1 2", 0.0), None);
    }

    #[test]
    fn boot_time_resident_memory_and_the_open_files_limit_are_found() {
        assert_eq!(resident_bytes("Name:\tturnstile\nVmRSS:\t   20480 kB\nThreads: 9\n"), Some(20 * 1024 * 1024));
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000.0));
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(max_open_files("Max open files            unlimited            unlimited            files"), None);
    }

    #[test]
    fn this_process_reports_its_figures_and_its_build() {
        let mut out = String::new();
        render(&mut out);
        assert!(out.contains("# TYPE turnstile_build_info gauge\n"), "{out}");
        assert!(
            out.contains(&format!("turnstile_build_info{{version=\"{}\",commit=\"", build_info().version)),
            "{out}"
        );
        if cfg!(target_os = "linux") {
            let stats = ProcessStats::read().unwrap();
            assert!(stats.resident_bytes > 0 && stats.open_fds.unwrap() >= 3, "{stats:?}");
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
            // Started before now, and not before the machine booted a year ago.
            assert!(stats.start_time_seconds <= now + 1.0 && stats.start_time_seconds > now - 366.0 * 86400.0);
            for name in ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"] {
                assert!(out.contains(&format!("\n{name} ")), "{name} missing: {out}");
            }
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
