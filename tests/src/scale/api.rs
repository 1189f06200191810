//! The API server of a scale run, the agent's and the harness's: the stub
//! (`kube_stub`, in this process) or a real kube-apiserver
//! (`real_api`), written to the same way.

use std::net::IpAddr;
use std::path::Path;

use serde_json::{Value, json};

use super::churn::Write;
use super::objects::{self, Size};
use super::real_api::RealApi;

use crate::cluster::{Peers, SimNode};
use crate::kube_stub::{ApiStub, Kind, ServedStub};

/// Writes made at once while a real API server is loaded.
const LOAD_CONCURRENCY: usize = 32;

pub enum ScaleApi {
    Stub(ServedStub),
    Real(RealApi),
}

/// Now, as the EndpointSlice controller stamps a change (RFC 3339).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now().to_string()
}

impl ScaleApi {
    /// The stub, or with `kubernetes` (a folder holding etcd and
    /// kube-apiserver) a real API server, on the loopback of `node`.
    pub fn start(kubernetes: Option<&Path>, node: &SimNode) -> anyhow::Result<Self> {
        Ok(match kubernetes {
            None => ScaleApi::Stub(ServedStub::serve_in(ApiStub::empty(), &node.netns)),
            Some(bin) => {
                let address = IpAddr::V4(node.spec.address());
                ScaleApi::Real(RealApi::start(bin, &node.netns, address)?)
            }
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            ScaleApi::Stub(_) => "stub",
            ScaleApi::Real(_) => "kube-apiserver",
        }
    }

    /// `writes`, in order.
    pub fn apply(&self, writes: Vec<Write>) -> anyhow::Result<()> {
        match self {
            ScaleApi::Stub(served) => {
                for write in writes {
                    apply_to_stub(&served.stub, write);
                }
                Ok(())
            }
            ScaleApi::Real(api) => api.write(writes, 1),
        }
    }

    pub fn put(&self, kind: Kind, object: Value) -> anyhow::Result<()> {
        self.apply(vec![Write::Put(kind, object)])
    }

    /// The recorded nodes (this one among them), then the synthetic
    /// cluster, a kind at a time in the order a cluster comes up (a
    /// namespace before its pods); a real API server gets each kind's
    /// objects many at once.
    pub fn load(&self, size: &Size) -> anyhow::Result<()> {
        let trigger = now_rfc3339();
        let mut writes: Vec<Write> = ApiStub::from_fixture()
            .list(Kind::Node)
            .into_iter()
            .map(|mut node| {
                if let Some(meta) = node["metadata"].as_object_mut() {
                    meta.retain(|key, _| key == "name" || key == "labels");
                }
                Write::Put(Kind::Node, node)
            })
            .collect();
        writes.extend(objects::all(size, &trigger).map(|(kind, object)| Write::Put(kind, object)));
        let ScaleApi::Real(api) = self else {
            return self.apply(writes);
        };
        let mut batch: Vec<Write> = Vec::new();
        for write in writes {
            if batch.last().is_some_and(|last| last.kind() != write.kind()) {
                api.write(std::mem::take(&mut batch), LOAD_CONCURRENCY)?;
            }
            batch.push(write);
        }
        api.write(batch, LOAD_CONCURRENCY)
    }

    /// How the agent finds this API server.
    pub fn peers(&self) -> Peers {
        match self {
            ScaleApi::Stub(served) => Peers::Api(served.url.clone()),
            ScaleApi::Real(api) => Peers::Kubeconfig(api.agent_kubeconfig.clone()),
        }
    }

    /// What the agent asked of the API server.
    pub fn requests(&self) -> Value {
        match self {
            ScaleApi::Stub(served) => {
                let stub = &served.stub;
                let of = |count: fn(&ApiStub, Kind) -> usize| -> usize {
                    Kind::ALL.iter().map(|k| count(stub, *k)).sum()
                };
                json!({"lists": of(ApiStub::lists), "watches": of(ApiStub::watches)})
            }
            ScaleApi::Real(api) => api.agent_requests(),
        }
    }
}

fn apply_to_stub(stub: &ApiStub, write: Write) {
    match write {
        Write::Put(kind, object) => stub.add(kind, object),
        Write::Delete(kind, key) => {
            if stub.get(kind, &key).is_some() {
                stub.delete(kind, &key)
            }
        }
    }
}
