//! `[memory]`: the per-tenant limits of memory (SPEC §20, decision 0147), and an agent's `memory` table:
//! the namespaces its built-in tools `memory_get`, `memory_put` and `memory_search` may reach.

use serde::Deserialize;

use crate::path::{Invalid, KeyPath, positive};

/// `[memory]`: what one tenant may keep.
///
/// ```
/// use turnstile_config::Config;
///
/// assert_eq!(Config::default().memory.max_document_bytes, 65_536);
/// let config = Config::from_toml_str("[memory]\nmax_documents_per_tenant = 10\n").unwrap();
/// assert_eq!(config.memory.max_documents_per_tenant, 10);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// The largest document, in bytes of its JSON text. Default 64 KiB.
    pub max_document_bytes: usize,
    /// Documents one tenant keeps over all its namespaces. Default 100,000.
    pub max_documents_per_tenant: usize,
    /// Bytes of one tenant's documents over all its namespaces. Default 256 MiB.
    pub max_bytes_per_tenant: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self { max_document_bytes: 64 * 1024, max_documents_per_tenant: 100_000, max_bytes_per_tenant: 256 << 20 }
    }
}

impl MemoryConfig {
    pub(crate) fn check(&self, path: &KeyPath) -> Result<(), Invalid> {
        positive(path, "max_document_bytes", self.max_document_bytes as u64, "0 would refuse every document")?;
        positive(path, "max_documents_per_tenant", self.max_documents_per_tenant as u64, "0 would refuse every put")?;
        positive(path, "max_bytes_per_tenant", self.max_bytes_per_tenant, "0 would refuse every put")?;
        if self.max_bytes_per_tenant < self.max_document_bytes as u64 {
            return Err(path.key("max_bytes_per_tenant").invalid(format!(
                "is {} but max_document_bytes is {}: a tenant could not keep one document of the largest size",
                self.max_bytes_per_tenant, self.max_document_bytes
            )));
        }
        Ok(())
    }
}

/// An agent's `memory = { namespaces = [...] }`: the namespaces of its session's tenant that its memory
/// tools may read and write. An agent without it reaches none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentMemory {
    /// Namespaces, each 1 to 64 of A-Z, a-z, 0-9, '-' and '_'.
    pub namespaces: Vec<String>,
}

impl AgentMemory {
    /// Whether `namespace` is one of the agent's.
    pub fn allows(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|n| n == namespace)
    }

    pub(crate) fn check(&self, path: &KeyPath) -> Result<(), Invalid> {
        let path = path.key("namespaces");
        if self.namespaces.is_empty() {
            return Err(path.invalid("is empty, so the memory tools could reach nothing; name at least one namespace"));
        }
        for (i, namespace) in self.namespaces.iter().enumerate() {
            turnstile_model::memory::validate_namespace(namespace).map_err(|e| path.index(i).invalid(e.to_string()))?;
        }
        Ok(())
    }
}
