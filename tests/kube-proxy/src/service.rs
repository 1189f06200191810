//! A Service port as kube-proxy sees it (`ServicePort`, with its
//! `Protocol`): what the rules are written for, as the tests and the bench
//! describe their Services.

use std::net::{IpAddr, SocketAddr};

use crate::names::{hash, target};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }

    pub(crate) fn upper(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

/// One port of a Service, as kube-proxy sees it after reading the Service
/// and its EndpointSlices (ready endpoints only).
#[derive(Clone, Debug)]
pub struct ServicePort {
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    /// Type NodePort.
    pub node_port: Option<u16>,
    pub endpoints: Vec<SocketAddr>,
    /// `externalTrafficPolicy: Local`: which of `endpoints` are on this
    /// node (kube-proxy's own, by their EndpointSlice's nodeName). None:
    /// `Cluster`. iptables mode only.
    pub local_endpoints: Option<Vec<SocketAddr>>,
}

impl ServicePort {
    /// A ClusterIP Service `default/<name>` with one port named `p<port>`.
    pub fn cluster_ip(
        name: &str,
        cluster_ip: IpAddr,
        port: u16,
        protocol: Protocol,
        endpoints: Vec<SocketAddr>,
    ) -> Self {
        ServicePort {
            namespace: "default".into(),
            name: name.into(),
            port_name: format!("p{port}"),
            cluster_ip,
            port,
            protocol,
            node_port: None,
            endpoints,
            local_endpoints: None,
        }
    }

    /// The same Service, of type NodePort on `node_port`.
    pub fn with_node_port(mut self, node_port: u16) -> Self {
        self.node_port = Some(node_port);
        self
    }

    /// The same Service with `externalTrafficPolicy: Local`, `local` its
    /// endpoints on the node whose kube-proxy this is.
    pub fn with_local_external_traffic(mut self, local: Vec<SocketAddr>) -> Self {
        self.local_endpoints = Some(local);
        self
    }

    /// The KUBE-SEP chain of `endpoint`.
    pub(crate) fn sep_chain(&self, endpoint: SocketAddr) -> String {
        format!(
            "KUBE-SEP-{}",
            hash(
                &format!(
                    "{}{}{}",
                    self.port_name_string(),
                    self.protocol.upper(),
                    target(endpoint)
                ),
                16
            )
        )
    }

    /// "ns/svc:port", kube-proxy's ServicePortName.
    pub(crate) fn port_name_string(&self) -> String {
        format!("{}/{}:{}", self.namespace, self.name, self.port_name)
    }

    pub(crate) fn is_v6(&self) -> bool {
        self.cluster_ip.is_ipv6()
    }
}
