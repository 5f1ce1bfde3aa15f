//! Why a verb refused a pod, and why a node takes no GPU pods. Each message names the pod
//! (or the node) and says what is wrong; kube-scheduler shows them in the pod's
//! `FailedScheduling` event, so their texts are part of the extender's interface.

use fgpu_driver::hami::RequestError;
use fgpu_driver::ledger::LedgerError;

use crate::annotations::NodeAnnotationError;
use crate::writer::WriteError;

/// Why a node in the cache takes no GPU pods until the next sync fixes it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// A slot made by a sync that has not filled it yet.
    #[error("not synced")]
    NotSynced,
    /// Its inventory annotation does not parse (the message names the node).
    #[error(transparent)]
    Inventory(NodeAnnotationError),
    /// The grants recorded on its pods do not fit its inventory.
    #[error(
        "node {node}: the GPU grants recorded on its pods do not fit its inventory ({source}); \
         no new GPU pods are placed there until that is resolved"
    )]
    Overbooked {
        /// The node.
        node: String,
        /// What the ledger refused (boxed: it is the largest part of the error).
        source: Box<LedgerError>,
    },
}

/// Why a pod does not fit on a node now (preemption may help): the reason kube-scheduler
/// shows for that node. Names the container; never contains `%`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoFit(pub String);

/// Why `/prioritize`, a reservation or `/bind` refused a pod. Every message starts with
/// the pod (`pod ns/name`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// The pod's `spec.schedulerName` is not the scheduler this extender serves.
    #[error(
        "pod {pod}: spec.schedulerName is {name:?}, not {ours:?}; this extender serves only \
         the pods of its own scheduler"
    )]
    OtherScheduler {
        /// `ns/name`.
        pod: String,
        /// The pod's scheduler name (empty when unset).
        name: String,
        /// `--scheduler-name`.
        ours: String,
    },
    /// Its resources or annotations do not make an engine request.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The node is not in the cache (no inventory annotation).
    #[error("pod {pod}: node {node} has no GPU inventory")]
    NoInventory {
        /// `ns/name`.
        pod: String,
        /// The node.
        node: String,
    },
    /// The node takes no GPU pods now.
    #[error("pod {pod}: {reason}")]
    Unusable {
        /// `ns/name`.
        pod: String,
        /// Why (names the node).
        reason: Unusable,
    },
    /// The pod does not fit on the node.
    #[error("pod {pod}: {reason}")]
    NoFit {
        /// `ns/name`.
        pod: String,
        /// Why (names the container).
        reason: NoFit,
    },
    /// The ledger refused a container's grant.
    #[error("pod {pod}: {source}")]
    Grant {
        /// `ns/name`.
        pod: String,
        /// What the ledger refused (boxed, as in [`Unusable::Overbooked`]).
        source: Box<LedgerError>,
    },
    /// The bind request has no pod UID.
    #[error("pod {pod}: the bind request has no PodUID; kube-scheduler always sends it")]
    NoPodUid {
        /// `ns/name`.
        pod: String,
    },
    /// The pod could not be read for the bind.
    #[error("pod {pod}: reading it for bind: {source}")]
    ReadPod {
        /// `ns/name`.
        pod: String,
        /// The API server's answer.
        source: WriteError,
    },
    /// The pod of that name has another UID than the bind request's.
    #[error("pod {pod}: UID {found} differs from the bind request's {asked}; the pod was replaced")]
    Replaced {
        /// `ns/name`.
        pod: String,
        /// The UID of the pod read.
        found: String,
        /// The bind request's.
        asked: String,
    },
    /// The pod is bound already.
    #[error("pod {pod} is already bound to node {node}; nothing changed")]
    AlreadyBound {
        /// `ns/name`.
        pod: String,
        /// Its `spec.nodeName`.
        node: String,
    },
    /// The assignment annotation could not be written.
    #[error("pod {pod}: recording the GPU assignment: {source}")]
    Annotate {
        /// `ns/name`.
        pod: String,
        /// The API server's answer.
        source: WriteError,
    },
    /// The Binding could not be created.
    #[error("pod {pod}: creating the Binding to {node}: {source}")]
    Binding {
        /// `ns/name`.
        pod: String,
        /// The node.
        node: String,
        /// The API server's answer.
        source: WriteError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts kube-scheduler shows, byte for byte (the long ones are split in the source).
    #[test]
    fn long_messages_read_as_one_line() {
        let e = PodError::OtherScheduler {
            pod: "ns/p".into(),
            name: String::new(),
            ours: "fgpu-scheduler".into(),
        };
        assert_eq!(
            e.to_string(),
            "pod ns/p: spec.schedulerName is \"\", not \"fgpu-scheduler\"; this extender serves only the pods of its own scheduler"
        );
        let e = PodError::Unusable {
            pod: "ns/p".into(),
            reason: Unusable::Overbooked {
                node: "n".into(),
                source: Box::new(LedgerError::UnknownGrant("g".into())),
            },
        };
        assert_eq!(
            e.to_string(),
            "pod ns/p: node n: the GPU grants recorded on its pods do not fit its inventory (no grant \"g\"); no new GPU pods are placed there until that is resolved"
        );
    }
}
