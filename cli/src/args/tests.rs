//! The command line parses as documented.

use clap::CommandFactory;

use super::*;

#[test]
fn the_cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn dev_takes_nats_with_its_layout() {
    let cli = Cli::try_parse_from(["turnstile", "dev"]).unwrap();
    let Cmd::Dev(a) = cli.command else { panic!("not dev") };
    assert_eq!((a.nats, a.partitions, a.replicas, a.serve.config), (None, None, None, None));
    let cli =
        Cli::try_parse_from(["turnstile", "dev", "--nats", "nats://h:4222", "--partitions", "4", "--replicas", "3"])
            .unwrap();
    let Cmd::Dev(a) = cli.command else { panic!("not dev") };
    assert_eq!((a.nats.as_deref(), a.partitions, a.replicas), (Some("nats://h:4222"), Some(4), Some(3)));
    assert!(Cli::try_parse_from(["turnstile", "dev", "--partitions", "2"]).is_err(), "layout without --nats");
    assert!(Cli::try_parse_from(["turnstile", "dev", "--nats", "nats://h", "--partitions", "0"]).is_err());
    assert!(Cli::try_parse_from(["turnstile", "dev", "--nats", "nats://h", "--data-dir", "d"]).is_err());
}

#[test]
fn gateway_takes_the_cluster_layout() {
    let cli = Cli::try_parse_from(["turnstile", "gateway", "--nats", "nats://h:4222"]).unwrap();
    let Cmd::Gateway(a) = cli.command else { panic!("not gateway") };
    assert_eq!((a.member.layout.partitions, a.member.layout.replicas, a.member.layout.shards), (None, None, None));
    assert_eq!((a.listen.as_str(), a.route_deadline_ms), ("127.0.0.1:7400", None));
    let cli = Cli::try_parse_from([
        "turnstile",
        "gateway",
        "--nats",
        "nats://h:4222",
        "--listen",
        "127.0.0.1:7401",
        "--replicas",
        "3",
        "--shards",
        "64",
    ])
    .unwrap();
    let Cmd::Gateway(a) = cli.command else { panic!("not gateway") };
    assert_eq!(
        (a.listen.as_str(), a.member.layout.replicas, a.member.layout.shards),
        ("127.0.0.1:7401", Some(3), Some(64))
    );
}

#[test]
fn worker_takes_its_identity_and_lease_timing() {
    let cli = Cli::try_parse_from([
        "turnstile",
        "worker",
        "--nats",
        "nats://h:4222",
        "--listen",
        "127.0.0.1:0",
        "--advertise",
        "10.0.0.5:7501",
        "--id",
        "w1",
        "--lease-ttl-ms",
        "3000",
        "--renew-ms",
        "500",
    ])
    .unwrap();
    let Cmd::Worker(a) = cli.command else { panic!("not worker") };
    assert_eq!((a.id.as_deref(), a.advertise.as_deref()), (Some("w1"), Some("10.0.0.5:7501")));
    assert_eq!(
        (a.lease_ttl_ms, a.renew_ms, a.drain_timeout_ms, a.member.layout.shards),
        (Some(3000), Some(500), None, None)
    );
    let flags = a.overrides();
    let loaded = a.member.serve.load(&flags).unwrap();
    assert_eq!((loaded.config.cluster.lease_ttl_ms, loaded.config.cluster.renew_ms), (3000, 500));
}

#[test]
fn the_servers_take_a_configuration_file() {
    for role in ["dev", "gateway", "worker"] {
        let mut args = vec!["turnstile", role, "--config", "t.toml"];
        if role != "dev" {
            args.extend(["--nats", "nats://h:4222"]);
        }
        let cli = Cli::try_parse_from(args).unwrap();
        let path = match cli.command {
            Cmd::Dev(a) => a.serve.config,
            Cmd::Gateway(a) => a.member.serve.config,
            Cmd::Worker(a) => a.member.serve.config,
            _ => panic!("not a server"),
        };
        assert_eq!(path.as_deref(), Some(std::path::Path::new("t.toml")), "{role}");
    }
    assert!(Cli::try_parse_from(["turnstile", "followup", "--config", "t.toml", "s1", "x"]).is_err());
}

#[test]
fn the_renewal_flags_are_checked_against_each_other() {
    let cli = Cli::try_parse_from([
        "turnstile",
        "worker",
        "--nats",
        "nats://h:4222",
        "--lease-ttl-ms",
        "400",
        "--renew-ms",
        "500",
    ])
    .unwrap();
    let Cmd::Worker(a) = cli.command else { panic!("not worker") };
    let flags = a.overrides();
    let err = a.member.serve.load(&flags).unwrap_err();
    assert_eq!(
        crate::error_line(&err),
        "error: --renew-ms 500 must be below --lease-ttl-ms 400, or leases lapse between renewals; try a third of it"
    );
}

#[test]
fn delivery_words_are_joined_and_options_parse() {
    let cli = Cli::try_parse_from([
        "turnstile",
        "--tenant",
        "acme",
        "steer",
        "s1",
        "hello",
        "there",
        "--expected-turn",
        "3",
        "--id",
        "m1",
        "--source",
        "plugin:mem",
    ])
    .unwrap();
    assert_eq!(cli.global.tenant.as_deref(), Some("acme"));
    let Cmd::Steer(s) = cli.command else { panic!("not steer") };
    assert_eq!(s.expected_turn, Some(3));
    let d = crate::client::Delivery::from(s.delivery);
    assert_eq!(d.text, "hello there");
    assert_eq!(d.id.as_deref(), Some("m1"));
    assert!(Cli::try_parse_from(["turnstile", "send", "s1", "x", "--target", "sideways"]).is_err());
    assert!(Cli::try_parse_from(["turnstile", "followup", "s1"]).is_err());
}
