//! The cluster as DNS sees it: every name that exists in the cluster zone
//! and in the reverse zones, with its data, built from Services and their
//! EndpointSlices (see `slices.rs`). It is rebuilt whole after each change
//! the watches see and read, never changed, by every query (see
//! `resolver.rs`).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_server::proto::ProtoError;
use hickory_server::proto::rr::Name;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::ConfigError;
use crate::slices::{self, SlicePort};

/// The version of the Kubernetes DNS schema served at `dns-version.<zone>`
/// (what CoreDNS reports for the specification it follows).
pub const DNS_SCHEMA_VERSION: &str = "1.1.0";

/// A zone this server answers for, with the names its SOA record holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Apex {
    pub(crate) name: Name,
    /// `ns.dns.<apex>`, as CoreDNS names the primary server.
    pub(crate) mname: Name,
    /// `hostmaster.<apex>`.
    pub(crate) rname: Name,
}

impl Apex {
    fn new(name: Name) -> Result<Self, ProtoError> {
        Ok(Apex {
            mname: Name::from_labels(["ns".as_bytes(), "dns".as_bytes()])?.append_domain(&name)?,
            rname: Name::from_labels(["hostmaster".as_bytes()])?.append_domain(&name)?,
            name,
        })
    }
}

/// What the command line says about the zone: its name and the TTL of
/// its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    ttl: u32,
    /// The cluster zone first, then in-addr.arpa. and ip6.arpa.
    apexes: [Apex; 3],
    dns_version: Name,
    svc: Name,
    pod: Name,
}

impl ZoneConfig {
    /// `zone` as given to `--zone` (a trailing dot optional, any case).
    pub fn new(zone: &str, ttl: u32) -> Result<Self, ConfigError> {
        let invalid = |source| ConfigError::InvalidZone {
            zone: zone.to_string(),
            source,
        };
        let mut name = Name::from_ascii(zone).map_err(invalid)?;
        name.set_fqdn(true);
        let name = name.to_lowercase();
        if name.is_root() {
            return Err(ConfigError::RootZone);
        }
        // The reverse zones' apexes: the last two labels of any address's
        // reverse name.
        let in_addr_arpa = Name::from(IpAddr::V4(Ipv4Addr::UNSPECIFIED)).trim_to(2);
        let ip6_arpa = Name::from(IpAddr::V6(Ipv6Addr::UNSPECIFIED)).trim_to(2);
        for reverse in [&in_addr_arpa, &ip6_arpa] {
            if reverse.zone_of(&name) || name.zone_of(reverse) {
                return Err(ConfigError::OverlapsReverseZones(name.to_string()));
            }
        }
        let child = |label: &str| {
            Name::from_labels([label.as_bytes()])
                .and_then(|l| l.append_domain(&name))
                .map_err(invalid)
        };
        Ok(ZoneConfig {
            ttl,
            dns_version: child("dns-version")?,
            svc: child("svc")?,
            pod: child("pod")?,
            apexes: [
                Apex::new(name.clone()).map_err(invalid)?,
                Apex::new(in_addr_arpa).map_err(invalid)?,
                Apex::new(ip6_arpa).map_err(invalid)?,
            ],
        })
    }

    /// The cluster zone, lowercase and fully qualified.
    pub fn zone(&self) -> &Name {
        &self.apexes[0].name
    }

    /// The TTL of every record but the schema version's.
    pub fn ttl(&self) -> u32 {
        self.ttl
    }

    /// The zone `name` (lowercase) belongs to, if it is one of ours.
    pub(crate) fn apex_of(&self, name: &Name) -> Option<&Apex> {
        self.apexes.iter().find(|apex| apex.name.zone_of(name))
    }

    pub(crate) fn dns_version(&self) -> &Name {
        &self.dns_version
    }

    pub(crate) fn pod(&self) -> &Name {
        &self.pod
    }
}

/// An SRV record's data but its priority and weight (those depend on how
/// many records share the name, see `resolver.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceTarget {
    pub(crate) port: u16,
    pub(crate) target: Name,
}

/// What one name holds. A name with nothing is an empty non-terminal: it
/// exists (NODATA, not NXDOMAIN) because names below it do.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct NameData {
    /// A and AAAA.
    pub(crate) addresses: Vec<IpAddr>,
    /// CNAME (an ExternalName service).
    pub(crate) alias: Option<Name>,
    /// SRV.
    pub(crate) services: Vec<ServiceTarget>,
    /// PTR.
    pub(crate) pointers: Vec<Name>,
}

/// Every name of the zones, as of one view of the API server's objects.
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    pub(crate) config: ZoneConfig,
    /// False until the Services and EndpointSlices have both been listed:
    /// until then no name can be said not to exist.
    pub(crate) synced: bool,
    /// The SOA serial.
    pub(crate) serial: u32,
    /// Keyed by lowercase name.
    pub(crate) names: HashMap<Name, NameData>,
}

impl ClusterSnapshot {
    /// The view before the first lists: in-zone queries get SERVFAIL.
    pub fn unsynced(config: ZoneConfig) -> Self {
        ClusterSnapshot {
            config,
            synced: false,
            serial: 0,
            names: HashMap::new(),
        }
    }

    /// The view of `services` and `slices` (all namespaces). `serial`
    /// becomes the SOA serial (the watches use the time of the change).
    /// Objects that cannot be named in DNS are left out, with a warning.
    pub fn build<'a>(
        config: ZoneConfig,
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        serial: u32,
    ) -> Self {
        let slices_by_service = slices::by_service(slices);
        // Sorted, so that answers list their records in a stable order.
        let services: BTreeMap<(&str, &str), &Service> = services
            .into_iter()
            .filter_map(|s| Some((object_key(&s.metadata)?, s)))
            .collect();
        let mut builder = Builder {
            config: &config,
            names: HashMap::new(),
            service_pointers: BTreeMap::new(),
            endpoint_pointers: BTreeMap::new(),
        };
        for (key, service) in services {
            let slices = slices_by_service.get(&key).map(Vec::as_slice);
            if let Err(error) = builder.add_service(key, service, slices.unwrap_or_default()) {
                tracing::warn!(namespace = key.0, service = key.1, %error, "service left out of DNS");
            }
        }
        let names = builder.finish();
        ClusterSnapshot {
            config,
            synced: true,
            serial,
            names,
        }
    }

    /// Whether the snapshot comes from complete lists (readiness).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The zone configuration it was built for.
    pub fn config(&self) -> &ZoneConfig {
        &self.config
    }
}

/// A Service's (namespace, name).
fn object_key(metadata: &ObjectMeta) -> Option<(&str, &str)> {
    Some((metadata.namespace.as_deref()?, metadata.name.as_deref()?))
}

/// How a Service is answered for.
enum ServiceKind {
    /// ClusterIP, NodePort, LoadBalancer: its ClusterIP(s).
    ClusterIps(Vec<IpAddr>),
    /// clusterIP None: its ready endpoints.
    Headless,
    /// A CNAME.
    ExternalName(Name),
}

fn service_kind(service: &Service) -> Result<Option<ServiceKind>, ProtoError> {
    let Some(spec) = service.spec.as_ref() else {
        return Ok(None);
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        let Some(external) = spec.external_name.as_deref().filter(|e| !e.is_empty()) else {
            return Ok(None);
        };
        // CoreDNS gives an address-shaped externalName no record, and so
        // does the Kubernetes documentation.
        if external.parse::<IpAddr>().is_ok() {
            return Ok(None);
        }
        let mut target = Name::from_ascii(external)?;
        target.set_fqdn(true);
        return Ok(Some(ServiceKind::ExternalName(target)));
    }
    let texts: Vec<&str> = match spec.cluster_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    if texts.first() == Some(&"None") {
        return Ok(Some(ServiceKind::Headless));
    }
    let ips: Vec<IpAddr> = texts.iter().filter_map(|t| t.parse().ok()).collect();
    // No ClusterIP allocated (yet): nothing to answer.
    Ok((!ips.is_empty()).then_some(ServiceKind::ClusterIps(ips)))
}

/// A port's SRV owner: `_<name>._<proto>.<service name>`.
fn srv_name(port_name: &str, protocol: &str, service_name: &Name) -> Result<Name, ProtoError> {
    let protocol = protocol.to_ascii_lowercase();
    Name::from_labels([
        format!("_{}", port_name.to_ascii_lowercase()).into_bytes(),
        format!("_{protocol}").into_bytes(),
    ])?
    .append_domain(service_name)
}

struct Builder<'c> {
    config: &'c ZoneConfig,
    names: HashMap<Name, NameData>,
    /// ClusterIP -> its service's name (a ClusterIP names one service).
    service_pointers: BTreeMap<IpAddr, Name>,
    /// Endpoint address -> its endpoint names (one per service selecting it).
    endpoint_pointers: BTreeMap<IpAddr, Vec<Name>>,
}

fn push_new<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

impl Builder<'_> {
    fn entry(&mut self, name: &Name) -> &mut NameData {
        self.names.entry(name.clone()).or_default()
    }

    fn add_service(
        &mut self,
        (namespace, name): (&str, &str),
        service: &Service,
        slices: &[&EndpointSlice],
    ) -> Result<(), ProtoError> {
        let Some(kind) = service_kind(service)? else {
            return Ok(());
        };
        let service_name =
            Name::from_labels([name.as_bytes(), namespace.as_bytes(), "svc".as_bytes()])?
                .append_domain(self.config.zone())?
                .to_lowercase();
        let headless = matches!(kind, ServiceKind::Headless);
        match kind {
            ServiceKind::ExternalName(target) => {
                self.entry(&service_name).alias = Some(target);
                // External services have no endpoints (CoreDNS ignores any).
                return Ok(());
            }
            ServiceKind::ClusterIps(ips) => {
                for ip in ips {
                    push_new(&mut self.entry(&service_name).addresses, ip);
                    self.service_pointers
                        .entry(ip)
                        .or_insert_with(|| service_name.clone());
                }
                let ports = service
                    .spec
                    .as_ref()
                    .and_then(|s| s.ports.as_deref())
                    .unwrap_or_default();
                for port in ports {
                    let Ok(number) = u16::try_from(port.port) else {
                        continue;
                    };
                    let port = SlicePort {
                        name: port.name.as_deref().filter(|n| !n.is_empty()),
                        protocol: port.protocol.as_deref().unwrap_or("TCP"),
                        port: number,
                    };
                    self.add_srv(&service_name, &port, &service_name)?;
                }
            }
            ServiceKind::Headless => {}
        }
        for slice in slices.iter().filter(|s| slices::holds_ips(s)) {
            let ports = slices::ports(slice);
            for endpoint in slices::ready_endpoints(slice) {
                for text in &endpoint.addresses {
                    let Ok(ip) = text.parse::<IpAddr>() else {
                        tracing::warn!(namespace, service = name, ip = %text, "unparsable endpoint address left out");
                        continue;
                    };
                    let label = slices::endpoint_label(endpoint, ip);
                    let endpoint_name =
                        Name::from_labels([label.into_bytes()])?.append_domain(&service_name)?;
                    push_new(&mut self.entry(&endpoint_name).addresses, ip);
                    push_new(
                        self.endpoint_pointers.entry(ip).or_default(),
                        endpoint_name.clone(),
                    );
                    if !headless {
                        // A ClusterIP service's SRV records point at the service.
                        continue;
                    }
                    push_new(&mut self.entry(&service_name).addresses, ip);
                    for port in &ports {
                        self.add_srv(&service_name, port, &endpoint_name)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// SRV to `target` for `port` of the service: at the service's name,
    /// and at `_<port>._<proto>.<service>` when the port has a name.
    fn add_srv(
        &mut self,
        service_name: &Name,
        port: &SlicePort<'_>,
        target: &Name,
    ) -> Result<(), ProtoError> {
        let target = ServiceTarget {
            port: port.port,
            target: target.clone(),
        };
        push_new(&mut self.entry(service_name).services, target.clone());
        if let Some(port_name) = port.name {
            let owner = srv_name(port_name, port.protocol, service_name)?;
            push_new(&mut self.entry(&owner).services, target);
        }
        Ok(())
    }

    fn finish(mut self) -> HashMap<Name, NameData> {
        // A ClusterIP points at its service; any other address at every
        // endpoint name it has (as CoreDNS).
        for (ip, service_name) in std::mem::take(&mut self.service_pointers) {
            self.entry(&Name::from(ip)).pointers = vec![service_name];
            self.endpoint_pointers.remove(&ip);
        }
        for (ip, endpoint_names) in std::mem::take(&mut self.endpoint_pointers) {
            self.entry(&Name::from(ip)).pointers = endpoint_names;
        }
        let config = self.config;
        for fixed in [config.dns_version(), &config.svc, &config.pod] {
            self.entry(fixed);
        }
        for apex in &config.apexes {
            self.entry(&apex.name);
        }
        // Every name between a name and its zone's apex exists too.
        let owners: Vec<Name> = self.names.keys().cloned().collect();
        for owner in owners {
            let Some(apex) = config.apex_of(&owner) else {
                continue;
            };
            let mut parent = owner.base_name();
            while parent.num_labels() > apex.name.num_labels() {
                self.entry(&parent);
                parent = parent.base_name();
            }
        }
        self.names
    }
}
