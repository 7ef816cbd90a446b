//! The fault campaign's long run (issue 14 part 5; docs/TESTING.md "Fault campaign"):
//!
//! ```text
//! TURNSTILE_BIN=target/debug/turnstile fault_campaign [--seed N] [--duration 30m|3600s|90] [--sessions N] [--clients N] [--out DIR]
//!     [--upgrade-from OLD_TURNSTILE_BIN] [--only KIND]
//! ```
//!
//! Runs [`turnstile_tests::campaign::run`] (the same function as the CI test, longer), prints the report
//! and exits 1 when the checker found a violation, 2 when the harness failed. `--upgrade-from` runs a
//! rolling upgrade from that binary to `TURNSTILE_BIN` instead of the fault schedule (SPEC §18;
//! `scripts/rolling-upgrade` builds the previous commit's binary and runs it). `--only` keeps the fault kinds
//! whose name contains KIND (e.g. `--only "partition nats"`), to study one kind.

use std::time::Duration;

use turnstile_tests::campaign::{CampaignConfig, Upgrade, run};

fn parse_duration(s: &str) -> Option<Duration> {
    let (number, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = number.parse().ok()?;
    match unit {
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        "h" => Some(Duration::from_secs(n * 3600)),
        _ => None,
    }
}

fn usage(why: &str) -> ! {
    eprintln!(
        "{why}\nusage: fault_campaign [--seed N] [--duration 30m|3600s|1h] [--sessions N] [--clients N] [--out DIR] \
         [--upgrade-from OLD_TURNSTILE_BIN] [--only KIND]"
    );
    std::process::exit(2)
}

fn main() {
    let seed =
        std::env::var("TURNSTILE_CAMPAIGN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    let mut config = CampaignConfig::new(seed, Duration::from_secs(3600));
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let mut value = || argv.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--seed" => config.seed = value().parse().unwrap_or_else(|_| usage("--seed takes a number")),
            "--duration" => {
                config.duration =
                    parse_duration(&value()).unwrap_or_else(|| usage("--duration takes 90, 90s, 30m or 1h"))
            }
            "--sessions" => config.sessions = value().parse().unwrap_or_else(|_| usage("--sessions takes a number")),
            "--clients" => config.clients = value().parse().unwrap_or_else(|_| usage("--clients takes a number")),
            "--out" => config.out_dir = value().into(),
            "--upgrade-from" => config.upgrade = Some(Upgrade { from: value().into() }),
            "--only" => config.only = Some(value()),
            "-h" | "--help" => usage("the fault campaign"),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if std::env::args().all(|a| a != "--out") {
        config.out_dir =
            std::env::temp_dir().join(format!("turnstile-fault-campaign-{}-{}", config.seed, std::process::id()));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap_or_else(|e| {
        eprintln!("cannot start tokio: {e}");
        std::process::exit(2)
    });
    match runtime.block_on(run(config)) {
        Ok(report) => {
            println!("{report}");
            std::process::exit(i32::from(!report.violations.is_empty()));
        }
        Err(e) => {
            eprintln!("the campaign's harness failed: {e}");
            std::process::exit(2)
        }
    }
}
