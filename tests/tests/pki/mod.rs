//! Throwaway certificate authorities for the TLS tests (`tls.rs`, `worker_auth.rs`): the harness's own.

pub use turnstile_tests::pki::make_ca;
