//! The prepare operation ([`Plugin::prepare`]): a claim already `PrepareCompleted` is
//! answered from its record; otherwise the claim is read and built (`claim`), then its
//! records and files are written by one task on the blocking pool ([`PrepareWork`]), and
//! each step is timed into the phase histogram.

use std::io;
use std::sync::Arc;

use super::claim::{Built, FileInputs, check_uid};
use super::files::ClaimFiles;
use super::lock::ClaimGuard;
use super::mig::MigSteps;
use super::{ClaimSource, Plugin, PrepareError, unpoisoned};
use crate::checkpoint::{Change, ClaimRecord, Durability, PrepareState, PreparedDevice, Records};
use crate::edits::{ClaimRef, PlannedDevice};
use crate::metrics::{Metrics, Operation, Phase};

impl<S: ClaimSource> Plugin<S> {
    /// Prepares `claim` and returns its devices (see the module documentation).
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        self.guarded(Operation::Prepare, claim, |guard| {
            self.prepare_locked(claim, guard)
        })
        .await
    }

    /// The devices of claim `uid` if it is recorded `PrepareCompleted`.
    fn completed_devices(&self, uid: &str) -> Option<Vec<PreparedDevice>> {
        self.records.read(|claims| {
            claims
                .get(uid)
                .filter(|rec| rec.state == PrepareState::PrepareCompleted)
                .map(|rec| rec.devices.clone())
        })
    }

    async fn prepare_locked(
        &self,
        claim: &ClaimRef,
        guard: ClaimGuard,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        // The kubelet still wants the claim: whatever a stale-claim sweep saw, it starts over.
        unpoisoned(&self.suspects).remove(&claim.uid);
        if let Some(devices) = self.completed_devices(&claim.uid) {
            if let Some(lost) = super::mig::lost(&claim.key(), &devices) {
                return Err(lost);
            }
            return Ok(devices);
        }
        let mut clock = PhaseClock::new(&self.metrics);
        let object = self.read_claim(claim).await?;
        clock.lap(Phase::ClaimGet);
        check_uid(claim, &object)?;
        let Built {
            started,
            files,
            devices,
            mig,
        } = self.build(claim, &object)?;
        clock.lap(Phase::Build);
        let content = match (files, mig) {
            (Some(files), _) => Content::Files(Box::new(files)),
            (None, planned) => Content::Mig(Box::new(MigContent {
                planned: planned.unwrap_or_default(),
                inputs: self.file_inputs(claim),
                steps: MigSteps {
                    backend: self.backend.clone(),
                },
            })),
        };
        let laps = self.write_claim(claim, started, content, guard).await;
        // The gauges follow the records even when a step failed (`PrepareStarted` may be on
        // record).
        self.refresh_claim_metrics();
        let (laps, created) = laps?;
        let devices = created.unwrap_or(devices);
        // RecordStarted includes the wait for a blocking thread.
        clock.lap_at(Phase::RecordStarted, laps.started);
        clock.lap_at(Phase::Files, laps.files);
        clock.lap(Phase::RecordCompleted);
        Ok(devices)
    }

    /// The side effects and both records: one task on the blocking pool (a slow disk must
    /// not stall other claims' gRPC), which holds the claim's lock until it ends.
    async fn write_claim(
        &self,
        claim: &ClaimRef,
        started: ClaimRecord,
        content: Content,
        guard: ClaimGuard,
    ) -> Result<(Laps, Option<Vec<PreparedDevice>>), PrepareError> {
        let claim_dir = started.claim_dir.clone();
        let work = PrepareWork {
            records: self.records.clone(),
            uid: claim.uid.clone(),
            started,
            content,
            test_pause: self.cfg.test_pause,
        };
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            work.run()
        })
        .await
        .map_err(|e| PrepareError::Io {
            claim: claim.key(),
            op: "write the claim's files",
            path: claim_dir,
            source: io::Error::other(e),
        })?
    }
}

/// Times the steps of one prepare into the phase histogram.
struct PhaseClock<'a> {
    metrics: &'a Metrics,
    last: std::time::Instant,
}

impl<'a> PhaseClock<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        Self {
            metrics,
            last: std::time::Instant::now(),
        }
    }

    /// Records the time since the previous lap as `phase`.
    fn lap(&mut self, phase: Phase) {
        self.lap_at(phase, std::time::Instant::now());
    }

    /// Records the time from the previous lap to `at` as `phase`.
    fn lap_at(&mut self, phase: Phase, at: std::time::Instant) {
        self.metrics
            .observe_phase(phase, at.saturating_duration_since(self.last));
        self.last = at;
    }
}

/// What a prepare writes besides its records.
enum Content {
    /// The claim's files, built (boxed, as the other variant: the enum is moved to the
    /// blocking pool).
    Files(Box<ClaimFiles>),
    /// A claim of MIG instances: they are found or created first, then its files built.
    Mig(Box<MigContent>),
}

/// What a claim of MIG instances writes, built once they exist.
struct MigContent {
    /// The claim's devices.
    planned: Vec<PlannedDevice>,
    /// What its files are built from.
    inputs: FileInputs,
    /// The backend's steps.
    steps: MigSteps,
}

/// The side effects of one prepare with its records, run on the blocking pool.
struct PrepareWork {
    records: Arc<Records>,
    uid: String,
    started: ClaimRecord,
    content: Content,
    test_pause: Option<std::time::Duration>,
}

/// When the steps of a [`PrepareWork`] ended.
struct Laps {
    started: std::time::Instant,
    files: std::time::Instant,
}

impl PrepareWork {
    /// Records `PrepareStarted` (atomically), writes the claim's files, records
    /// `PrepareCompleted` (durably). Stops at the first step that fails: a record of
    /// `PrepareStarted` that stays behind makes a repeated prepare redo the files and an
    /// unprepare remove them. For a claim of MIG instances, between the first record and
    /// the files: the instances found or created (`mig`), then `PrepareStarted` again
    /// naming them; the devices it returns then name them too.
    fn run(self) -> Result<(Laps, Option<Vec<PreparedDevice>>), PrepareError> {
        let Self {
            records,
            uid,
            mut started,
            content,
            test_pause,
        } = self;
        let claim = format!("{}/{}", started.namespace, started.name);
        let checkpoint = |source| PrepareError::Checkpoint {
            claim: claim.clone(),
            source,
        };
        // PrepareStarted is read only by a restart of the plugin in this boot, which sees the
        // file without an fsync (the kernel keeps it); after a reboot the boot id discards
        // every record. So it is written atomically but not durably: one fsync per prepare.
        let record_started = |record: &ClaimRecord| {
            records
                .apply(Change::Put {
                    uid: uid.clone(),
                    record: record.clone(),
                    durability: Durability::Atomic,
                })
                .map_err(checkpoint)
        };
        record_started(&started)?;
        let started_at = std::time::Instant::now();
        let (files, created) = match content {
            Content::Files(files) => (*files, None),
            Content::Mig(mig) => {
                let MigContent {
                    mut planned,
                    inputs,
                    steps,
                } = *mig;
                steps.ensure(&records, &claim, &uid, &started, &mut planned)?;
                let (files, devices) = inputs.build(&planned)?;
                started.devices = devices.clone();
                record_started(&started)?;
                (files, Some(devices))
            }
        };
        let completed = ClaimRecord {
            state: PrepareState::PrepareCompleted,
            ..started
        };
        files.write()?;
        let files_at = std::time::Instant::now();
        if let Some(pause) = test_pause {
            tracing::warn!(%claim, %uid, ?pause,
                "test pause: claim files written, PrepareCompleted not yet recorded");
            std::thread::sleep(pause);
        }
        records
            .apply(Change::Put {
                uid,
                record: completed,
                durability: Durability::Fsync,
            })
            .map_err(checkpoint)?;
        Ok((
            Laps {
                started: started_at,
                files: files_at,
            },
            created,
        ))
    }
}
