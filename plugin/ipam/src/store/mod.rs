//! Where allocations live: the [`AllocationStore`] trait the verbs use,
//! its on-disk implementation [`DiskStore`] (`disk`: layout, crash safety,
//! durability), and an in-memory one for the verbs' unit tests.

mod disk;

#[cfg(test)]
use std::collections::HashSet;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

#[cfg(test)]
use flatnet_cni::error::Error;
use flatnet_cni::error::Result;

pub use disk::{DiskStore, attachment_key};

/// One allocation: an address held by an attachment in a range set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    pub address: IpAddr,
    #[serde(rename = "rangeSet")]
    pub range_set: usize,
}

/// What the IPAM verbs need from a store. All calls happen while the store
/// is exclusively held by this process.
pub trait AllocationStore {
    /// Whether `ip` is held, by a record or by anything else using its name.
    fn is_taken(&self, ip: IpAddr) -> bool;
    /// The addresses an attachment holds, as (range set, address).
    fn held_by(&mut self, container_id: &str, ifname: &str) -> Result<Vec<(usize, IpAddr)>>;
    /// The record holding `ip`, if there is a readable one.
    fn owner(&self, ip: IpAddr) -> Option<Record>;
    /// Reserves `record.address` for its attachment; false when taken.
    fn reserve(&mut self, record: &Record) -> Result<bool>;
    /// Releases everything an attachment holds; returns the addresses freed.
    fn release(&mut self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>>;
    /// Releases one record that [`reserve`](Self::reserve) made.
    fn unreserve(&mut self, record: &Record) -> Result<()>;
    /// Every readable record; unreadable ones are reported and left alone.
    fn records(&mut self) -> Result<Vec<Record>>;
    /// The last address reserved in a range set (where the walk continues).
    fn last_reserved(&self, range_set: usize) -> Option<IpAddr>;
    fn set_last_reserved(&mut self, range_set: usize, ip: IpAddr) -> Result<()>;
    /// Makes the changes so far as durable as the store is configured to.
    fn commit(&mut self) -> Result<()>;
}

/// An in-memory store with the same semantics, for unit tests of the verbs.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub records: Vec<Record>,
    /// Taken by something that is not a record (a foreign file).
    pub foreign: HashSet<IpAddr>,
    pub last: std::collections::HashMap<usize, IpAddr>,
    pub commits: usize,
    /// Container IDs whose release fails, to test going on past failures.
    pub fail_release: HashSet<String>,
}

#[cfg(test)]
impl AllocationStore for MemoryStore {
    fn is_taken(&self, ip: IpAddr) -> bool {
        self.foreign.contains(&ip) || self.records.iter().any(|r| r.address == ip)
    }

    fn held_by(&mut self, container_id: &str, ifname: &str) -> Result<Vec<(usize, IpAddr)>> {
        let mut held: Vec<_> = self
            .records
            .iter()
            .filter(|r| r.container_id == container_id && r.ifname == ifname)
            .map(|r| (r.range_set, r.address))
            .collect();
        held.sort_unstable();
        Ok(held)
    }

    fn owner(&self, ip: IpAddr) -> Option<Record> {
        self.records.iter().find(|r| r.address == ip).cloned()
    }

    fn reserve(&mut self, record: &Record) -> Result<bool> {
        if self.is_taken(record.address) {
            return Ok(false);
        }
        self.records.push(record.clone());
        Ok(true)
    }

    fn release(&mut self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>> {
        if self.fail_release.contains(container_id) {
            return Err(Error::Store(format!("cannot release {container_id}")));
        }
        let (gone, kept) = std::mem::take(&mut self.records)
            .into_iter()
            .partition(|r| r.container_id == container_id && r.ifname == ifname);
        self.records = kept;
        Ok(gone.into_iter().map(|r: Record| r.address).collect())
    }

    fn unreserve(&mut self, record: &Record) -> Result<()> {
        self.records.retain(|r| r != record);
        Ok(())
    }

    fn records(&mut self) -> Result<Vec<Record>> {
        Ok(self.records.clone())
    }

    fn last_reserved(&self, range_set: usize) -> Option<IpAddr> {
        self.last.get(&range_set).copied()
    }

    fn set_last_reserved(&mut self, range_set: usize, ip: IpAddr) -> Result<()> {
        self.last.insert(range_set, ip);
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        self.commits += 1;
        Ok(())
    }
}
