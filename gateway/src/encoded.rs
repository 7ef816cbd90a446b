//! The gRPC `Watch` sent from bytes encoded once per feed item (decision 0178).
//!
//! The generated server encodes every `WatchItem` of every stream with prost: a feed item shared by a
//! thousand watchers of a session was cloned and encoded a thousand times. [`WatchEncodedOnce`] serves the
//! same `AgentServer` but answers `/turnstile.v1.Agent/Watch` itself, through the same
//! [`Agent::watch`] (auth, quotas, validation and the stream's rules are the service's), with a codec whose
//! messages are bytes already encoded: a feed item's are the ones [`crate::watch_buffer::WatchBuffers::hold`]
//! made when the feed took it, shared by every watcher. On the wire nothing changes: the same messages.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut as _, Bytes};
use prost::Message as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_server::{Agent, AgentServer};

use crate::Gateway;
use crate::watch_buffer::{EncodedItemStream, ItemStream};

/// The method this service answers itself.
const WATCH_PATH: &str = "/turnstile.v1.Agent/Watch";

/// The public API's server, with `Watch` sent from shared encoded bytes.
#[derive(Clone)]
pub struct WatchEncodedOnce {
    server: AgentServer<Gateway>,
    gateway: Arc<Gateway>,
    max_request_bytes: usize,
}

impl WatchEncodedOnce {
    pub(crate) fn new(gateway: Gateway) -> Self {
        let max_request_bytes = gateway.config.max_request_bytes;
        Self { server: gateway.clone().into_server(), gateway: Arc::new(gateway), max_request_bytes }
    }
}

impl NamedService for WatchEncodedOnce {
    const NAME: &'static str = <AgentServer<Gateway> as NamedService>::NAME;
}

impl<B> Service<http::Request<B>> for WatchEncodedOnce
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != WATCH_PATH {
            return self.server.call(req);
        }
        let (gateway, limit) = (self.gateway.clone(), self.max_request_bytes);
        Box::pin(async move {
            // The generated server's settings: no compression, requests up to the gateway's limit.
            let mut grpc = tonic::server::Grpc::new(WatchCodec).apply_max_message_size_config(Some(limit), None);
            Ok(grpc.server_streaming(WatchMethod(gateway), req).await)
        })
    }
}

/// `Watch` through the service's own method, its items as encoded bytes.
struct WatchMethod(Arc<Gateway>);

impl ServerStreamingService<pb::WatchRequest> for WatchMethod {
    type Response = Bytes;
    type ResponseStream = EncodedItemStream;
    type Future = BoxFuture<Response<EncodedItemStream>, Status>;

    fn call(&mut self, request: Request<pb::WatchRequest>) -> Self::Future {
        let gateway = self.0.clone();
        Box::pin(async move {
            let items = Agent::watch(gateway.as_ref(), request).await?;
            Ok(items.map(ItemStream::into_encoded))
        })
    }
}

/// Decodes a `WatchRequest` as prost does; sends messages already encoded as they are.
#[derive(Clone, Copy, Debug, Default)]
struct WatchCodec;

impl Codec for WatchCodec {
    type Encode = Bytes;
    type Decode = pb::WatchRequest;
    type Encoder = Encoded;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Encoded {
        Encoded
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Encoded;

impl Encoder for Encoded {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = pb::WatchRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<pb::WatchRequest>, Status> {
        // As prost's codec answers a request it cannot parse.
        pb::WatchRequest::decode(src).map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}
