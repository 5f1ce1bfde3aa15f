//! The MIG state of one GPU: which placements are taken, and whether another one fits.
//!
//! A [`MigLayout`] is a GPU's [`MigTable`] and the instances on it (profile and placement).
//! A new instance fits when its placement is one of the profile's, its memory slices are
//! free, the GPU has the compute slices left, the profile is below its instance limit, and,
//! for a `+me` profile, no other instance holds the media extensions.

use super::profiles::{MigProfile, MigTable, Placement};

/// One instance on a GPU: its profile and placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// The instance's profile.
    pub profile: &'static MigProfile,
    /// Where it sits.
    pub placement: Placement,
}

impl std::fmt::Display for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.profile.name, self.placement)
    }
}

/// Why a MIG instance cannot be placed or chosen. Each names the GPU model, the profile and
/// the placement, and says what would be valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// The model has no profile of this name.
    #[error("{model}: no MIG profile {profile:?}; its profiles are {}", known.join(", "))]
    UnknownProfile {
        /// The GPU model.
        model: &'static str,
        /// The name asked for.
        profile: String,
        /// The model's profiles.
        known: Vec<&'static str>,
    },
    /// The profile cannot start at this memory slice.
    #[error(
        "{model}: MIG profile {profile} cannot start at memory slice {start}; its placements start at {valid:?}"
    )]
    NoSuchPlacement {
        /// The GPU model.
        model: &'static str,
        /// The profile.
        profile: &'static str,
        /// The start asked for.
        start: u8,
        /// The profile's valid starts.
        valid: &'static [u8],
    },
    /// Some of the placement's memory slices are taken.
    #[error("{model}: MIG profile {profile} at {placement} overlaps the instance {other}")]
    Overlap {
        /// The GPU model.
        model: &'static str,
        /// The profile.
        profile: &'static str,
        /// The placement asked for.
        placement: Placement,
        /// The instance in the way.
        other: String,
    },
    /// The GPU has too few compute slices left.
    #[error("{model}: MIG profile {profile} needs {needs} compute slices; {free} are free")]
    ComputeExhausted {
        /// The GPU model.
        model: &'static str,
        /// The profile.
        profile: &'static str,
        /// Compute slices it needs.
        needs: u8,
        /// Compute slices free.
        free: u8,
    },
    /// The profile is at its instance limit.
    #[error("{model}: MIG profile {profile} already has its maximum of {max} instances")]
    InstanceLimit {
        /// The GPU model.
        model: &'static str,
        /// The profile.
        profile: &'static str,
        /// The limit.
        max: u8,
    },
    /// Another instance holds the media extensions.
    #[error("{model}: MIG profile {profile} needs the media extensions, which {other} holds")]
    MediaExtensionsTaken {
        /// The GPU model.
        model: &'static str,
        /// The profile.
        profile: &'static str,
        /// The instance holding them.
        other: String,
    },
    /// The request is larger than every profile of the model (or asks more compute slices
    /// than any profile with enough memory has).
    #[error("{model}: no MIG profile holds {request}; the largest is {largest}")]
    TooLarge {
        /// The GPU model.
        model: &'static str,
        /// The request, as `memory 100.0 GiB` or `memory 20.0 GiB, 5 compute slices`.
        request: String,
        /// The model's largest profile.
        largest: &'static str,
    },
    /// Profiles would hold the request, but none has a free placement on this GPU.
    #[error("{model}: no free placement for {request} (profiles tried: {})", tried.join(", "))]
    NoFreePlacement {
        /// The GPU model.
        model: &'static str,
        /// The request.
        request: String,
        /// The profiles that would hold it, smallest first.
        tried: Vec<&'static str>,
    },
    /// No GPU was offered to choose from.
    #[error("no GPU in MIG mode to place {request} on")]
    NoGpus {
        /// The request.
        request: String,
    },
}

/// The instances on one GPU in MIG mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigLayout {
    table: &'static MigTable,
    taken: Vec<Taken>,
}

impl MigLayout {
    /// An empty GPU of the model `table`.
    pub fn new(table: &'static MigTable) -> Self {
        Self {
            table,
            taken: Vec::new(),
        }
    }

    /// A GPU holding `instances` (profile name, start slice), each checked as [`take`]
    /// would.
    ///
    /// [`take`]: Self::take
    pub fn with_instances<'a>(
        table: &'static MigTable,
        instances: impl IntoIterator<Item = (&'a str, u8)>,
    ) -> Result<Self, MigError> {
        let mut layout = Self::new(table);
        for (profile, start) in instances {
            layout.take(profile, start)?;
        }
        Ok(layout)
    }

    /// The GPU's model table.
    pub fn table(&self) -> &'static MigTable {
        self.table
    }

    /// The instances, in the order they were taken.
    pub fn taken(&self) -> &[Taken] {
        &self.taken
    }

    /// The taken memory slices as a bit mask.
    pub fn used_mask(&self) -> u32 {
        self.taken.iter().fold(0, |m, t| m | t.placement.mask())
    }

    /// Free memory slices.
    pub fn free_memory_slices(&self) -> u8 {
        self.table.memory_slices - self.used_mask().count_ones() as u8
    }

    /// Free compute slices.
    pub fn free_compute_slices(&self) -> u8 {
        let used: u8 = self.taken.iter().map(|t| t.profile.compute_slices).sum();
        self.table.compute_slices.saturating_sub(used)
    }

    /// The profile called `name` on this model.
    pub fn profile(&self, name: &str) -> Result<&'static MigProfile, MigError> {
        self.table
            .profile(name)
            .ok_or_else(|| MigError::UnknownProfile {
                model: self.table.model,
                profile: name.to_owned(),
                known: self.table.profile_names(),
            })
    }

    /// Whether an instance of `profile` fits at `start`; the error says why not.
    pub fn check(&self, profile: &'static MigProfile, start: u8) -> Result<Placement, MigError> {
        let model = self.table.model;
        let placement = Placement {
            start,
            size: profile.memory_slices,
        };
        if !profile.starts.contains(&start) {
            return Err(MigError::NoSuchPlacement {
                model,
                profile: profile.name,
                start,
                valid: profile.starts,
            });
        }
        if let Some(other) = self
            .taken
            .iter()
            .find(|t| t.placement.mask() & placement.mask() != 0)
        {
            return Err(MigError::Overlap {
                model,
                profile: profile.name,
                placement,
                other: other.to_string(),
            });
        }
        let free = self.free_compute_slices();
        if profile.compute_slices > free {
            return Err(MigError::ComputeExhausted {
                model,
                profile: profile.name,
                needs: profile.compute_slices,
                free,
            });
        }
        let same = self
            .taken
            .iter()
            .filter(|t| t.profile.name == profile.name)
            .count();
        if same >= usize::from(profile.max_instances) {
            return Err(MigError::InstanceLimit {
                model,
                profile: profile.name,
                max: profile.max_instances,
            });
        }
        if profile.media_extensions
            && let Some(other) = self.taken.iter().find(|t| t.profile.media_extensions)
        {
            return Err(MigError::MediaExtensionsTaken {
                model,
                profile: profile.name,
                other: other.to_string(),
            });
        }
        Ok(placement)
    }

    /// Places an instance of the profile called `profile` at `start`.
    pub fn take(&mut self, profile: &str, start: u8) -> Result<Placement, MigError> {
        let profile = self.profile(profile)?;
        let placement = self.check(profile, start)?;
        self.taken.push(Taken { profile, placement });
        Ok(placement)
    }

    /// Removes the instance of `profile` at `start`; whether there was one.
    pub fn release(&mut self, profile: &str, start: u8) -> bool {
        let before = self.taken.len();
        self.taken
            .retain(|t| !(t.profile.name == profile && t.placement.start == start));
        self.taken.len() != before
    }

    /// Every placement that fits now, in table order then start order.
    pub fn free_placements(&self) -> Vec<Taken> {
        self.table
            .profiles
            .iter()
            .flat_map(|profile| {
                profile
                    .starts
                    .iter()
                    .filter_map(move |&s| self.check(profile, s).ok())
                    .map(move |placement| Taken { profile, placement })
            })
            .collect()
    }

    /// How many placements of each profile fit now, the largest profile first (most memory
    /// slices, then most compute slices): the measure [`super::choose()`] keeps as high as it
    /// can, compared in that order.
    pub fn free_score(&self) -> FreeScore {
        let mut profiles: Vec<&'static MigProfile> = self.table.profiles.iter().collect();
        profiles.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices)));
        FreeScore(
            profiles
                .iter()
                .map(|p| {
                    p.starts
                        .iter()
                        .filter(|&&s| self.check(p, s).is_ok())
                        .count() as u8
                })
                .collect(),
        )
    }

    /// The largest profile (most memory slices, then compute slices) that still fits.
    pub fn largest_placeable(&self) -> Option<&'static MigProfile> {
        self.table
            .profiles
            .iter()
            .filter(|p| p.starts.iter().any(|&s| self.check(p, s).is_ok()))
            .max_by_key(|p| (p.memory_slices, p.compute_slices))
    }
}

/// Free placements per profile, the largest profile first; compared lexicographically
/// (more free placements of a larger profile wins).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FreeScore(pub Vec<u8>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::profiles::table_for;

    fn h100() -> &'static MigTable {
        table_for("NVIDIA H100 80GB HBM3", 80 << 30).unwrap()
    }

    #[test]
    fn placements_refuse_overlap_limits_and_bad_starts() {
        let mut l = MigLayout::new(h100());
        assert_eq!(
            l.take("3g.40gb", 4).unwrap(),
            Placement { start: 4, size: 4 }
        );
        assert_eq!(
            l.take("1g.10gb", 5).unwrap_err().to_string(),
            "H100 80GB: MIG profile 1g.10gb at {5}:1 overlaps the instance 3g.40gb at {4}:4"
        );
        assert!(matches!(
            l.take("2g.20gb", 1),
            Err(MigError::NoSuchPlacement { start: 1, .. })
        ));
        // 3g.40gb + 2g.20gb + 2g.20gb: all memory and compute slices.
        l.take("2g.20gb", 0).unwrap();
        l.take("2g.20gb", 2).unwrap();
        assert_eq!((l.free_memory_slices(), l.free_compute_slices()), (0, 0));
        assert!(l.free_placements().is_empty());
        assert!(l.release("2g.20gb", 2));
        assert!(!l.release("2g.20gb", 2));
        assert_eq!(l.free_memory_slices(), 2);
    }

    #[test]
    fn compute_slices_run_out_before_memory_slices() {
        // Seven 1g.10gb use every compute slice; memory slice 7 stays free but useless.
        let l = MigLayout::with_instances(h100(), (0..7).map(|s| ("1g.10gb", s))).unwrap();
        assert_eq!((l.free_memory_slices(), l.free_compute_slices()), (1, 0));
        assert!(l.free_placements().is_empty());
        // Four 1g.20gb fill the memory with 3 compute slices stranded.
        let l = MigLayout::with_instances(h100(), [0, 2, 4, 6].map(|s| ("1g.20gb", s))).unwrap();
        assert_eq!((l.free_memory_slices(), l.free_compute_slices()), (0, 3));
        // 4g.40gb + 3g.40gb take all 7 compute slices.
        let mut l = MigLayout::with_instances(h100(), [("4g.40gb", 0), ("3g.40gb", 4)]).unwrap();
        assert_eq!(l.free_compute_slices(), 0);
        assert!(matches!(
            l.take("7g.80gb", 0),
            Err(MigError::Overlap { .. })
        ));
    }

    #[test]
    fn one_instance_holds_the_media_extensions() {
        let mut l = MigLayout::new(h100());
        l.take("1g.10gb+me", 6).unwrap();
        let e = l.take("1g.10gb+me", 0).unwrap_err();
        assert!(matches!(e, MigError::InstanceLimit { max: 1, .. }), "{e}");
        let a30 = table_for("NVIDIA A30", 24 << 30).unwrap();
        let mut l = MigLayout::new(a30);
        l.take("1g.6gb+me", 0).unwrap();
        assert_eq!(
            l.take("2g.12gb+me", 2).unwrap_err().to_string(),
            "A30 24GB: MIG profile 2g.12gb+me needs the media extensions, which 1g.6gb+me at {0}:1 holds"
        );
        assert!(l.take("2g.12gb", 2).is_ok());
        assert!(matches!(
            l.take("4g.24gb", 0),
            Err(MigError::Overlap { .. })
        ));
        assert!(matches!(
            l.take("5g.30gb", 0),
            Err(MigError::UnknownProfile { .. })
        ));
    }

    #[test]
    fn largest_placeable_and_score_follow_the_layout() {
        let mut l = MigLayout::new(h100());
        assert_eq!(l.largest_placeable().unwrap().name, "7g.80gb");
        // Order: 7g, 4g, 3g, 2g, 1g.20gb, 1g.10gb, 1g.10gb+me.
        assert_eq!(l.free_score(), FreeScore(vec![1, 1, 2, 3, 4, 7, 7]));
        l.take("1g.10gb", 0).unwrap();
        assert_eq!(l.largest_placeable().unwrap().name, "3g.40gb");
        assert_eq!(l.free_score(), FreeScore(vec![0, 0, 1, 2, 3, 6, 6]));
    }
}
