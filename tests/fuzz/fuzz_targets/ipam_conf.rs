//! flatnet-ipam's configuration: any bytes give an address plan or a typed
//! error, never a panic (ranges, gateways, exclusions, requested IPs).
#![no_main]

use flatnet_ipam::config::IpamConf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = IpamConf::parse(data);
});
