//! Generates the Rust code of `turnstile.v1` and the internal `turnstile.cluster.v1` with the vendored protoc, so a fresh machine needs no
//! system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/turnstile/v1/events.proto",
        "proto/turnstile/v1/agent.proto",
        "proto/turnstile/cluster/v1/cluster.proto",
        "proto/turnstile/hooks/v1/hooks.proto",
    ];
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // `prost::Name` on every message: its full name finds its descriptor (the CLI's `--json` mapping).
    config.enable_type_names();
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("turnstile_descriptor.bin"))
        .compile_with_config(config, &files, &["proto"])?;
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    Ok(())
}
