//! The prepare state machine: where a claim stands in the checkpoint and which moves
//! between those states the plugin makes. Pure; [`Records::apply`](super::Records::apply)
//! asks [`transition`] before every change.
//!
//! | from | to | move |
//! |---|---|---|
//! | no record | `PrepareStarted` | [`Transition::Begin`]: a prepare begins |
//! | `PrepareStarted` | `PrepareStarted` | [`Transition::Redo`]: an interrupted prepare is done again |
//! | `PrepareStarted` | `PrepareCompleted` | [`Transition::Complete`]: its files are in place |
//! | `PrepareStarted` or `PrepareCompleted` | no record | [`Transition::Forget`]: unprepare |
//! | no record | no record | [`Transition::AlreadyAbsent`]: unprepare of an unknown claim |
//! | `PrepareCompleted` | `PrepareCompleted` | [`Transition::Amend`]: the start-up reconcile re-created a lost MIG instance, or marked it lost |
//!
//! Refused: recording a claim `PrepareCompleted` that was never `PrepareStarted` (its files
//! may not exist), and demoting a `PrepareCompleted` record (a prepare returns a completed
//! claim as recorded; demoting it would make the plugin redo the files of a claim that
//! containers may already use).

use std::fmt;

use super::format::{ClaimRecord, PrepareState};

/// Where a claim stands in the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClaimState {
    /// No record: never prepared, or unprepared.
    Absent,
    /// Recorded `PrepareStarted`: side effects may have started.
    Started,
    /// Recorded `PrepareCompleted`: everything is in place.
    Completed,
}

impl ClaimState {
    /// The state of a claim whose record (if any) is `record`.
    pub fn of(record: Option<&ClaimRecord>) -> Self {
        record.map_or(Self::Absent, |r| r.state.into())
    }
}

impl From<PrepareState> for ClaimState {
    fn from(state: PrepareState) -> Self {
        match state {
            PrepareState::PrepareStarted => Self::Started,
            PrepareState::PrepareCompleted => Self::Completed,
        }
    }
}

impl fmt::Display for ClaimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Absent => "no record",
            Self::Started => "PrepareStarted",
            Self::Completed => "PrepareCompleted",
        })
    }
}

/// A move [`transition`] allows, named for what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// `Absent -> Started`: a prepare begins.
    Begin,
    /// `Started -> Started`: a prepare that was interrupted (a crash, a failed step) is
    /// done again.
    Redo,
    /// `Started -> Completed`: the claim's files are in place.
    Complete,
    /// `Started | Completed -> Absent`: an unprepare (or the stale-claim cleanup).
    Forget,
    /// `Absent -> Absent`: an unprepare of a claim that is not recorded (idempotent).
    AlreadyAbsent,
    /// `Completed -> Completed`: the start-up reconcile changed a prepared claim's MIG
    /// instance (created again after it vanished, with its new UUID and spec, or marked
    /// lost). Nothing else rewrites a completed record.
    Amend,
}

/// A move between states that the plugin never makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot go from {from} to {to}: {}", why(*from, *to))]
pub struct TransitionError {
    /// The state the claim is in.
    pub from: ClaimState,
    /// The state asked for.
    pub to: ClaimState,
}

fn why(from: ClaimState, to: ClaimState) -> &'static str {
    match (from, to) {
        (ClaimState::Absent, ClaimState::Completed) => {
            "a claim is recorded PrepareStarted before its files are written"
        }
        _ => "a prepared claim is returned as recorded, and is never demoted",
    }
}

/// Checks the move of a claim from `from` to `to`: the [`Transition`] it is, or why it is
/// refused.
pub fn transition(from: ClaimState, to: ClaimState) -> Result<Transition, TransitionError> {
    use ClaimState::{Absent, Completed, Started};
    match (from, to) {
        (Absent, Started) => Ok(Transition::Begin),
        (Started, Started) => Ok(Transition::Redo),
        (Started, Completed) => Ok(Transition::Complete),
        (Started | Completed, Absent) => Ok(Transition::Forget),
        (Absent, Absent) => Ok(Transition::AlreadyAbsent),
        (Completed, Completed) => Ok(Transition::Amend),
        (Absent, Completed) | (Completed, Started) => Err(TransitionError { from, to }),
    }
}

#[cfg(test)]
mod tests {
    use super::ClaimState::{Absent, Completed, Started};
    use super::*;

    #[test]
    fn the_moves_of_prepare_and_unprepare_are_allowed() {
        assert_eq!(transition(Absent, Started), Ok(Transition::Begin));
        assert_eq!(transition(Started, Started), Ok(Transition::Redo));
        assert_eq!(transition(Started, Completed), Ok(Transition::Complete));
        assert_eq!(transition(Started, Absent), Ok(Transition::Forget));
        assert_eq!(transition(Completed, Absent), Ok(Transition::Forget));
        assert_eq!(transition(Absent, Absent), Ok(Transition::AlreadyAbsent));
        assert_eq!(transition(Completed, Completed), Ok(Transition::Amend));
    }

    #[test]
    fn completing_without_starting_and_demoting_a_completed_claim_are_refused() {
        for (from, to) in [(Absent, Completed), (Completed, Started)] {
            assert_eq!(transition(from, to), Err(TransitionError { from, to }));
        }
        assert_eq!(
            transition(Absent, Completed).unwrap_err().to_string(),
            "cannot go from no record to PrepareCompleted: a claim is recorded PrepareStarted \
             before its files are written"
        );
        assert_eq!(
            transition(Completed, Started).unwrap_err().to_string(),
            "cannot go from PrepareCompleted to PrepareStarted: a prepared claim is returned \
             as recorded, and is never demoted"
        );
    }

    #[test]
    fn every_pair_of_states_is_decided() {
        // Exactly two of the nine pairs are refused.
        let all = [Absent, Started, Completed];
        let refused = all
            .iter()
            .flat_map(|&from| all.iter().map(move |&to| (from, to)))
            .filter(|&(from, to)| transition(from, to).is_err())
            .count();
        assert_eq!(refused, 2);
    }

    #[test]
    fn a_record_gives_its_state() {
        let mut record = ClaimRecord::default();
        assert_eq!(ClaimState::of(None), Absent);
        assert_eq!(ClaimState::of(Some(&record)), Started);
        record.state = PrepareState::PrepareCompleted;
        assert_eq!(ClaimState::of(Some(&record)), Completed);
    }
}
