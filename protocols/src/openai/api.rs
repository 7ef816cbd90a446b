//! The gateway's service as this adapter calls it: the protocols' shared [`crate::api::Api`] answering
//! OpenAI-shaped errors.

use super::error::ApiError;

pub use crate::api::{Delivery, Watch, session};

/// One HTTP caller's view of the gateway.
pub type Api = crate::api::Api<ApiError>;

impl crate::api::ProtocolError for ApiError {
    fn at(self, param: &str) -> Self {
        ApiError::at(self, param)
    }
}

/// The next item of a Watch; its end is an error (the gateway ends streams only when shutting down).
pub async fn next(watch: &mut Watch) -> Result<turnstile_proto::v1::WatchItem, ApiError> {
    Ok(crate::api::next(watch).await?)
}

impl Delivery {
    /// `value` of the request field `param` as a delivery preset.
    pub fn parse(value: &str, param: &str) -> Result<Self, ApiError> {
        Delivery::from_name(value)
            .ok_or_else(|| ApiError::invalid(param, format!("{param} is {value:?}; allowed: {}", Delivery::NAMES)))
    }
}
