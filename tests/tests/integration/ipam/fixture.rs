//! What the flatnet-ipam tests share: a /24 of each test's own, the
//! address a result holds, and a config with one key changed.

use std::net::IpAddr;

use serde_json::Value;

/// A /24 of its own for each test (the store does not care, people reading logs do).
pub(super) fn subnet(third: u8) -> String {
    format!("10.251.{third}.0/24")
}

pub(super) fn address_of(result: &Value, index: usize) -> IpAddr {
    let text = result["ips"][index]["address"].as_str().expect("address");
    text.split('/')
        .next()
        .and_then(|ip| ip.parse().ok())
        .expect("an IP")
}

pub(super) fn with_key(conf: &Value, key: &str, value: Value) -> Vec<u8> {
    let mut conf = conf.clone();
    conf[key] = value;
    conf.to_string().into_bytes()
}
