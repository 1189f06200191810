//! What every plugin checks of its network configuration before reading
//! its own fields: the size and shape of stdin, and the network's name.

use super::env::is_spec_name;
use super::error::{Error, Result};

/// Largest stdin a plugin accepts; real configs are a few KiB.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;
/// Network names become bpffs directory names and nftables identifiers.
pub const MAX_NETWORK_NAME: usize = 128;
/// IPv4 needs at least 68 bytes; veth cannot go past 65535.
pub const MTU_RANGE: std::ops::RangeInclusive<u32> = 68..=65535;

/// The spec's grammar for network names, and a length bpffs and nftables take.
pub fn validate_network_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::config(
            "\"name\" is missing: give the network a name",
        ));
    }
    if !is_spec_name(name) || name.len() > MAX_NETWORK_NAME {
        return Err(Error::config(format!(
            "\"name\" {name:?} is not a valid network name: start with a letter or digit, then letters, digits, '_', '.' or '-', at most {MAX_NETWORK_NAME} characters"
        )));
    }
    Ok(())
}

/// What every plugin checks of stdin before parsing it: not larger than a
/// configuration can be, not empty, and a JSON object.
pub fn check_stdin(stdin: &[u8]) -> Result<()> {
    if stdin.len() > MAX_CONFIG_BYTES {
        // The runner stops reading one byte past the limit.
        return Err(Error::config(format!(
            "stdin holds more than {MAX_CONFIG_BYTES} bytes; a network configuration may be at most that"
        )));
    }
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::decode(
            "network configuration",
            "stdin is empty; the runtime must pass the network configuration as JSON",
        ));
    }
    // serde would read a JSON array as the struct's fields in order.
    if stdin.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Error::decode(
            "network configuration",
            "it must be a JSON object ({\"cniVersion\": ..., \"name\": ..., ...})",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_non_json_stdin_are_decode_errors() {
        for stdin in [&b""[..], b"  \n", b"not json", b"[1,2]"] {
            assert_eq!(check_stdin(stdin).unwrap_err().code(), 6);
        }
        assert!(check_stdin(b" {}").is_ok());
    }

    #[test]
    fn oversized_stdin_is_refused_before_parsing() {
        let big = vec![b' '; MAX_CONFIG_BYTES + 1];
        assert_eq!(check_stdin(&big).unwrap_err().code(), 7);
    }

    #[test]
    fn network_names_follow_the_spec_and_fit_bpffs() {
        assert!(validate_network_name("pods.1-a_b").is_ok());
        for bad in ["", "bad name", "-x", &"x".repeat(MAX_NETWORK_NAME + 1)] {
            assert_eq!(validate_network_name(bad).unwrap_err().code(), 7, "{bad:?}");
        }
    }
}
