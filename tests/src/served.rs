//! One SPEC scenario, three deployments: the embedded journal, `turnstile dev --nats`, and a real cluster
//! (3 workers, 2 gateways) whose sessions alternate their calls between the gateways.

use tonic::transport::Channel;
use turnstile_proto::v1::agent_client::AgentClient;

use crate::{Cluster, DevServer, HarnessError, Session, new_session_ref};

/// Where a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// `turnstile dev` on the embedded journal.
    Embedded,
    /// `turnstile dev --nats` on a nats-server of its own.
    Nats,
    /// `turnstile worker` ×3 and `turnstile gateway` ×2 on a nats-server: every session's calls alternate
    /// between the two gateways.
    Cluster,
}

/// A running deployment; dropping it stops every process.
#[derive(Debug)]
pub enum Served {
    Dev(Box<DevServer>),
    Cluster(Box<Cluster>),
}

impl Deployment {
    pub async fn start(self) -> Result<Served, HarnessError> {
        match self {
            Self::Embedded => Ok(Served::Dev(Box::new(crate::Backend::Embedded.start_dev().await?))),
            Self::Nats => Ok(Served::Dev(Box::new(crate::Backend::Nats.start_dev().await?))),
            Self::Cluster => Ok(Served::Cluster(Box::new(Cluster::start(3, 2).await?))),
        }
    }
}

impl Served {
    /// A fresh session; on a cluster its calls alternate between the gateways.
    pub fn session(&self) -> Session {
        match self {
            Self::Dev(server) => server.session(),
            Self::Cluster(cluster) => {
                let clients = (0..cluster.gateways()).map(|g| cluster.client(g)).collect();
                Session::alternating(clients, new_session_ref())
            }
        }
    }

    /// A client of the (first) public endpoint.
    pub fn client(&self) -> AgentClient<Channel> {
        match self {
            Self::Dev(server) => server.client(),
            Self::Cluster(cluster) => cluster.client(0),
        }
    }
}

/// Runs each named `async fn NAME(deployment: Deployment)` of the calling file as three tests:
/// `embedded::NAME`, `nats::NAME` and `cluster::NAME`.
#[macro_export]
macro_rules! scenario_tests {
    ($($name:ident),+ $(,)?) => {
        $crate::scenario_tests!(@module embedded, Embedded, $($name),+);
        $crate::scenario_tests!(@module nats, Nats, $($name),+);
        $crate::scenario_tests!(@module cluster, Cluster, $($name),+);
    };
    (@module $module:ident, $deployment:ident, $($name:ident),+) => {
        mod $module {
            $(
                #[::tokio::test]
                async fn $name() {
                    super::$name($crate::Deployment::$deployment).await;
                }
            )+
        }
    };
}
