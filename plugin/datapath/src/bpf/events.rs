//! NetworkPolicy drop events: the `POLICY_EVENTS` ring buffer the programs
//! write one `PolicyEvent` into for every packet policy drops, read here
//! (`flatnet monitor`). The kernel keeps one consumer position per ring
//! buffer: one reader at a time.

use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::RingBuf;
use flatnet_common::{MAP_POLICY_EVENTS, PolicyEvent, maps};

use aya::maps::MapData;

use super::Datapath;
use crate::error::{Error, Result};

/// The network's `POLICY_EVENTS`, open for reading.
pub struct PolicyEvents {
    ring: RingBuf<MapData>,
}

impl Datapath {
    /// Opens the pinned `POLICY_EVENTS` (a datapath pinned by a build
    /// without it has none until its next load).
    pub fn policy_events(&self) -> Result<PolicyEvents> {
        let path = self.map_path(MAP_POLICY_EVENTS);
        if !path.exists() {
            return Err(Error::Datapath(format!(
                "{} is not pinned (a datapath loaded by an older build): the next ADD, \
                 the agent's next start or `flatnet repair` adds it",
                path.display()
            )));
        }
        let ring = self.ring_buf::<maps::POLICY_EVENTS>()?;
        Ok(PolicyEvents { ring })
    }

    /// The network name this datapath is pinned for (undoing `pin_name`).
    pub fn network_name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().replace('~', "."))
            .unwrap_or_default()
    }
}

impl PolicyEvents {
    /// Every event waiting now, oldest first (never blocks). A record of
    /// another size (not this build's layout) is skipped.
    pub fn drain(&mut self) -> Vec<PolicyEvent> {
        let mut events = Vec::new();
        while let Some(item) = self.ring.next() {
            if let Some(event) = decode(&item) {
                events.push(event);
            }
        }
        events
    }

    /// The ring buffer's descriptor: readable when events are waiting.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }
}

/// A `PolicyEvent` from a record's bytes.
pub fn decode(bytes: &[u8]) -> Option<PolicyEvent> {
    if bytes.len() != std::mem::size_of::<PolicyEvent>() {
        return None;
    }
    // SAFETY: the length is checked; `PolicyEvent` is plain data valid for
    // any bit pattern, and the read does not need the bytes aligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<PolicyEvent>()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_from_their_bytes_only() {
        let event = PolicyEvent {
            timestamp_ns: 7,
            slot: 3,
            reason: 2,
            ..PolicyEvent::default()
        };
        // SAFETY: plain data.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&event as *const PolicyEvent).cast::<u8>(),
                std::mem::size_of::<PolicyEvent>(),
            )
        };
        assert_eq!(decode(bytes), Some(event));
        assert_eq!(decode(&bytes[1..]), None);
    }
}
