//! The rules of SPEC §1–§2 that every value is checked by (names, message ids, sources, a message's
//! content and size) and [`ValueError`], which says the rule a value broke and how to fix it. The values
//! themselves are plain data in [`crate::message`] and [`crate::tenant`]; their checks live here, above
//! them and [`crate::size`], so none of those files imports another in a circle.

use crate::message::{MAX_ID_LEN, MessageId, MessageSource, PLUGIN_FORMS, SessionRef, UserMessage};
use crate::size::{BLOCK_OVERHEAD_BYTES, message_bytes};
use crate::tenant::Tenant;

impl SessionRef {
    /// Builds a session reference after checking both parts.
    pub fn new(tenant: impl Into<String>, id: impl Into<String>) -> Result<Self, ValueError> {
        let r = Self { tenant: tenant.into(), id: id.into() };
        r.validate()?;
        Ok(r)
    }

    /// A session of `tenant` (already valid): only `id` is checked.
    pub fn in_tenant(tenant: &Tenant, id: impl Into<String>) -> Result<Self, ValueError> {
        let id = id.into();
        validate_name("session id", &id)?;
        Ok(Self { tenant: tenant.as_str().to_owned(), id })
    }

    pub fn validate(&self) -> Result<(), ValueError> {
        Tenant::validate(&self.tenant)?;
        validate_name("session id", &self.id)
    }
}

impl MessageId {
    pub fn validate(&self) -> Result<(), ValueError> {
        if self.0.is_empty() || self.0.len() > MAX_ID_LEN {
            return Err(ValueError::MessageIdLength { len: self.0.len() });
        }
        Ok(())
    }
}

impl MessageSource {
    pub fn validate(&self) -> Result<(), ValueError> {
        match self {
            Self::Plugin { form: Some(form), .. } if !form.is_empty() && !PLUGIN_FORMS.contains(&form.as_str()) => {
                Err(ValueError::PluginForm { form: form.clone() })
            }
            Self::Goal { round: 0, .. } => Err(ValueError::GoalRound),
            Self::Goal { goal_id, .. } if goal_id.is_empty() => {
                Err(ValueError::EmptyField { field: "source.goal.goal_id" })
            }
            Self::Tool { call_id } if call_id.is_empty() => {
                Err(ValueError::EmptyField { field: "source.tool.call_id" })
            }
            Self::Session { session, .. } if session.is_empty() => {
                Err(ValueError::EmptyField { field: "source.session.session" })
            }
            Self::Schedule { schedule_id, .. } if schedule_id.is_empty() => {
                Err(ValueError::EmptyField { field: "source.schedule.schedule_id" })
            }
            _ => Ok(()),
        }
    }
}

impl UserMessage {
    /// Checks the id, the source, that there is content, and the size ([`message_bytes`])
    /// against `max_bytes` (`limits.max_message_bytes`).
    pub fn validate(&self, max_bytes: usize) -> Result<(), ValueError> {
        self.id.validate()?;
        self.source.validate()?;
        if !self.has_content() {
            return Err(ValueError::NoContent { id: self.id.clone() });
        }
        let size = message_bytes(self);
        if size > max_bytes {
            return Err(ValueError::TooLarge { id: self.id.clone(), size, max: max_bytes });
        }
        Ok(())
    }
}

impl Tenant {
    /// The tenant named `name`, or why the name is not one.
    pub fn new(name: impl Into<String>) -> Result<Self, ValueError> {
        let name = name.into();
        Self::validate(&name)?;
        Ok(Self(name))
    }

    /// Whether `name` is a valid tenant name (the rule [`crate::SessionRef::validate`] applies too).
    pub fn validate(name: &str) -> Result<(), ValueError> {
        validate_name("tenant", name)
    }
}

impl TryFrom<String> for Tenant {
    type Error = ValueError;

    fn try_from(name: String) -> Result<Self, ValueError> {
        Self::new(name)
    }
}

/// `value` as a name of `what` (tenant, session id): 1 to [`MAX_ID_LEN`] bytes of `[A-Za-z0-9_-]`.
pub(crate) fn validate_name(what: &'static str, value: &str) -> Result<(), ValueError> {
    if value.is_empty() || value.len() > MAX_ID_LEN {
        return Err(ValueError::NameLength { what, len: value.len() });
    }
    if let Some(c) = value.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
        return Err(ValueError::NameChar { what, value: value.to_owned(), c });
    }
    Ok(())
}

/// A value that breaks the rules of SPEC §1–§2. Messages say what was wrong and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("{what} must be 1 to 128 bytes, got {len}")]
    NameLength { what: &'static str, len: usize },
    #[error("{what} {value:?} has the character {c:?}; use only A-Z, a-z, 0-9, '-' and '_'")]
    NameChar { what: &'static str, value: String, c: char },
    #[error("message id must be 1 to 128 bytes, got {len}; mint a UUID per message")]
    MessageIdLength { len: usize },
    #[error(
        "plugin source form {form:?} is unknown; use one of instructions, catalog, snapshot, notice, relay, recall, or leave it empty"
    )]
    PluginForm { form: String },
    #[error("goal source round must be at least 1")]
    GoalRound,
    #[error("{field} must not be empty")]
    EmptyField { field: &'static str },
    #[error(
        "message {id} counts {size} bytes (its id, source and every field of every block, plus {overhead} per \
         block), over the limit of {max} (config limits.max_message_bytes); split it or send the data by reference",
        overhead = BLOCK_OVERHEAD_BYTES
    )]
    TooLarge { id: MessageId, size: usize, max: usize },
    #[error(
        "message {id} has {blocks} content blocks; each counts at least {overhead} bytes, so at most {max_blocks} \
         fit the limit of {max} (config limits.max_message_bytes); merge the blocks or send the data by reference",
        overhead = BLOCK_OVERHEAD_BYTES
    )]
    TooManyBlocks { id: MessageId, blocks: usize, max_blocks: usize, max: usize },
    #[error(
        "message {id} has no content; send at least one text block with non-blank text, or a data block with bytes"
    )]
    NoContent { id: MessageId },
}
