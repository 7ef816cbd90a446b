//! Cluster membership of a worker: shard leases, ownership checks, and the internal gRPC service.

pub mod service;
