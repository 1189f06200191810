//! A Service's endpoints as DNS reads them from discovery.k8s.io/v1
//! EndpointSlices, the way CoreDNS's kubernetes plugin does: a Service's
//! slices are those of its namespace labelled `kubernetes.io/service-name`
//! with its name, however many there are (one per address family at least,
//! more past 100 endpoints), merged; an endpoint counts while its
//! `conditions.ready` is not false (unset means ready, as the API says);
//! each of its addresses is named by its `hostname`; a slice's ports belong
//! to every endpoint of that slice.

use std::collections::HashMap;
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

/// The label that names a slice's Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// (namespace, Service name) -> that Service's slices, sorted by name so
/// that answers list their records in a stable order.
pub(crate) fn by_service<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> HashMap<(&'a str, &'a str), Vec<&'a EndpointSlice>> {
    let mut grouped: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for slice in slices {
        let metadata = &slice.metadata;
        let service = metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SERVICE_NAME_LABEL));
        // A slice of no Service (one made without the label) names nothing.
        if let (Some(namespace), Some(service)) = (metadata.namespace.as_deref(), service) {
            grouped
                .entry((namespace, service.as_str()))
                .or_default()
                .push(slice);
        }
    }
    for group in grouped.values_mut() {
        group.sort_by_key(|slice| slice.metadata.name.as_deref());
    }
    grouped
}

/// A slice port DNS can name: a number, and the name and protocol it has
/// (the protocol TCP when unset, as the API defaults it).
pub(crate) struct SlicePort<'a> {
    pub(crate) name: Option<&'a str>,
    pub(crate) protocol: &'a str,
    pub(crate) port: u16,
}

/// The ports of `slice` (a port without a number, "all ports", has no SRV
/// record and is left out).
pub(crate) fn ports(slice: &EndpointSlice) -> Vec<SlicePort<'_>> {
    slice
        .ports
        .iter()
        .flatten()
        .filter_map(|port| {
            Some(SlicePort {
                name: port.name.as_deref().filter(|name| !name.is_empty()),
                protocol: port.protocol.as_deref().unwrap_or("TCP"),
                port: u16::try_from(port.port?).ok()?,
            })
        })
        .collect()
}

/// Whether the slice holds IP addresses (addressType IPv4 or IPv6): the
/// deprecated FQDN slices hold names DNS cannot answer with.
pub(crate) fn holds_ips(slice: &EndpointSlice) -> bool {
    matches!(slice.address_type.as_str(), "IPv4" | "IPv6")
}

/// The endpoints of `slice` that count: `conditions.ready` true or unset.
/// (A terminating endpoint is not ready; with `publishNotReadyAddresses`
/// the slice controller marks every endpoint ready.)
pub(crate) fn ready_endpoints(slice: &EndpointSlice) -> impl Iterator<Item = &Endpoint> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter(|endpoint| endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(false))
}

/// The endpoint's name under its service: its hostname, else its address
/// with dashes (as CoreDNS: 10-244-1-5, fd00--5).
pub(crate) fn endpoint_label(endpoint: &Endpoint, ip: IpAddr) -> String {
    match endpoint.hostname.as_deref().filter(|h| !h.is_empty()) {
        Some(hostname) => hostname.to_ascii_lowercase(),
        None => ip.to_string().replace(['.', ':'], "-"),
    }
}
