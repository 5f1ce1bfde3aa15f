//! The usage ledger: which share of which GPU, CPU and memory is granted to whom.
//!
//! The ledger is a pure function of the capacity inventory and the set of live grants:
//! [`Ledger::rebuild`] from the grants recorded in the cluster gives exactly the state that
//! the sequence of [`Ledger::grant`] / [`Ledger::release`] calls produced (granting and
//! releasing are exact inverses). A grant that would take more than is free — memory or
//! cores of a GPU, CPU or memory of a node — is refused whole, and nothing changes.

use std::collections::{BTreeMap, HashMap};

use crate::engine::model::Kind;
use crate::engine::{Inventory, MILLI, Node, Placement, Request};

/// What one GPU gives to one grant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceGrant {
    /// The GPU's `id` on its node.
    pub gpu: String,
    /// Device memory in bytes.
    pub memory: u64,
    /// Percent of the GPU's SMs.
    pub cores: u32,
}

/// One granted allocation (a claim's or a pod's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// Unique key of the grant (claim UID, pod UID, ...).
    pub id: String,
    pub node: String,
    /// Host CPU in milli-cores and memory in MiB (0 where not accounted).
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub devices: Vec<DeviceGrant>,
}

impl Grant {
    /// The kind of request this grant (on `node`) is, as a live allocator's workload model
    /// sees it: its GPUs, and per GPU the larger of its memory and core share of that GPU
    /// (the largest over its GPUs); no host needs (a claim states none). `None` when it
    /// holds no GPU of `node`.
    pub fn kind_on(&self, node: &Node) -> Option<Kind> {
        let share = |used: u64, total: u64| {
            (u128::from(used) * u128::from(MILLI)).div_ceil(u128::from(total.max(1))) as u32
        };
        let milli = self
            .devices
            .iter()
            .filter_map(|d| {
                let g = node.gpus.iter().find(|g| g.id == d.gpu)?;
                let cores = share(u64::from(d.cores), u64::from(g.cores_total));
                Some(share(d.memory, g.memory_total).max(cores).min(MILLI))
            })
            .max()?;
        Some((0, 0, self.devices.len() as u32, milli))
    }

    /// The grant that realises `placement` of `req` on `inv`.
    pub fn from_placement(
        id: impl Into<String>,
        inv: &Inventory,
        req: &Request,
        placement: &Placement,
    ) -> Grant {
        let node = &inv.nodes[placement.node];
        Grant {
            id: id.into(),
            node: node.name.clone(),
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
            devices: placement
                .gpus
                .iter()
                .map(|&i| {
                    let g = &node.gpus[i];
                    let (memory, cores) = req.per_gpu(g);
                    DeviceGrant {
                        gpu: g.id.clone(),
                        memory,
                        cores,
                    }
                })
                .collect(),
        }
    }
}

/// Why the ledger refused a grant or a release.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("grant {0:?} already exists; release it first or use another id")]
    Duplicate(String),
    #[error("no grant {0:?}")]
    UnknownGrant(String),
    #[error("grant {grant:?}: node {node:?} is not in the inventory")]
    UnknownNode { grant: String, node: String },
    #[error("grant {grant:?}: node {node:?} has no GPU {gpu:?}")]
    UnknownGpu {
        grant: String,
        node: String,
        gpu: String,
    },
    #[error("grant {grant:?}: GPU {gpu:?} appears more than once")]
    RepeatedGpu { grant: String, gpu: String },
    #[error("grant {grant:?} over-grants {what} on {place}: wants {wanted}, only {free} is free")]
    OverGrant {
        grant: String,
        place: String,
        what: &'static str,
        wanted: u64,
        free: u64,
    },
}

/// Granted usage over a capacity inventory.
#[derive(Clone, Debug)]
pub struct Ledger {
    /// Current state: totals from the capacity, free values after every live grant.
    state: Inventory,
    grants: BTreeMap<String, Grant>,
    node_index: HashMap<String, usize>,
}

impl PartialEq for Ledger {
    fn eq(&self, other: &Self) -> bool {
        self.state == other.state && self.grants == other.grants
    }
}

impl Ledger {
    /// An empty ledger: every free value of `capacity` is reset to its total.
    pub fn new(capacity: Inventory) -> Ledger {
        let mut state = capacity;
        for n in &mut state.nodes {
            n.cpu_milli_free = n.cpu_milli_total;
            n.memory_mib_free = n.memory_mib_total;
            for g in &mut n.gpus {
                g.memory_free = g.memory_total;
                g.cores_free = g.cores_total;
            }
        }
        let node_index = state
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        Ledger {
            state,
            grants: BTreeMap::new(),
            node_index,
        }
    }

    /// The ledger of `capacity` with every grant of `grants` applied.
    pub fn rebuild(
        capacity: Inventory,
        grants: impl IntoIterator<Item = Grant>,
    ) -> Result<Ledger, LedgerError> {
        let mut l = Ledger::new(capacity);
        for g in grants {
            l.grant(g)?;
        }
        Ok(l)
    }

    /// The inventory with current free values: what the engine evaluates.
    pub fn inventory(&self) -> &Inventory {
        &self.state
    }

    /// The inventory with current free values, the ledger given up (no copy of it where
    /// the caller keeps only the inventory).
    pub fn into_inventory(self) -> Inventory {
        self.state
    }

    /// Live grants, by id.
    pub fn grants(&self) -> impl Iterator<Item = &Grant> {
        self.grants.values()
    }

    pub fn get(&self, id: &str) -> Option<&Grant> {
        self.grants.get(id)
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// Records a grant; refuses it whole when anything is unknown or over-granted.
    pub fn grant(&mut self, g: Grant) -> Result<(), LedgerError> {
        if self.grants.contains_key(&g.id) {
            return Err(LedgerError::Duplicate(g.id));
        }
        let ni = *self
            .node_index
            .get(&g.node)
            .ok_or_else(|| LedgerError::UnknownNode {
                grant: g.id.clone(),
                node: g.node.clone(),
            })?;
        let node = &self.state.nodes[ni];
        let over =
            |place: &str, what: &'static str, wanted: u64, free: u64| LedgerError::OverGrant {
                grant: g.id.clone(),
                place: place.to_string(),
                what,
                wanted,
                free,
            };
        if let Some(free) = node.cpu_milli_free
            && g.cpu_milli > free
        {
            return Err(over(&node.name, "CPU (milli)", g.cpu_milli, free));
        }
        if let Some(free) = node.memory_mib_free
            && g.memory_mib > free
        {
            return Err(over(&node.name, "memory (MiB)", g.memory_mib, free));
        }
        let mut idx = Vec::with_capacity(g.devices.len());
        for d in &g.devices {
            let gi = node
                .gpus
                .iter()
                .position(|x| x.id == d.gpu)
                .ok_or_else(|| LedgerError::UnknownGpu {
                    grant: g.id.clone(),
                    node: g.node.clone(),
                    gpu: d.gpu.clone(),
                })?;
            if idx.contains(&gi) {
                return Err(LedgerError::RepeatedGpu {
                    grant: g.id.clone(),
                    gpu: d.gpu.clone(),
                });
            }
            let gpu = &node.gpus[gi];
            let place = format!("{}/{}", node.name, gpu.id);
            if d.memory > gpu.memory_free {
                return Err(over(
                    &place,
                    "GPU memory (bytes)",
                    d.memory,
                    gpu.memory_free,
                ));
            }
            if d.cores > gpu.cores_free {
                return Err(over(
                    &place,
                    "GPU cores (%)",
                    u64::from(d.cores),
                    u64::from(gpu.cores_free),
                ));
            }
            idx.push(gi);
        }
        let node = &mut self.state.nodes[ni];
        if let Some(f) = node.cpu_milli_free.as_mut() {
            *f -= g.cpu_milli;
        }
        if let Some(f) = node.memory_mib_free.as_mut() {
            *f -= g.memory_mib;
        }
        for (d, &gi) in g.devices.iter().zip(&idx) {
            let gpu = &mut node.gpus[gi];
            gpu.memory_free -= d.memory;
            gpu.cores_free -= d.cores;
        }
        self.grants.insert(g.id.clone(), g);
        Ok(())
    }

    /// Removes a grant and gives its resources back; returns it.
    pub fn release(&mut self, id: &str) -> Result<Grant, LedgerError> {
        let g = self
            .grants
            .remove(id)
            .ok_or_else(|| LedgerError::UnknownGrant(id.to_string()))?;
        let ni = self.node_index[&g.node];
        let node = &mut self.state.nodes[ni];
        if let Some(f) = node.cpu_milli_free.as_mut() {
            *f += g.cpu_milli;
        }
        if let Some(f) = node.memory_mib_free.as_mut() {
            *f += g.memory_mib;
        }
        for d in &g.devices {
            let gpu = node
                .gpus
                .iter_mut()
                .find(|x| x.id == d.gpu)
                .expect("validated at grant");
            gpu.memory_free += d.memory;
            gpu.cores_free += d.cores;
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests;
