//! The checkpoint's tests across its parts: the record directory, the live records, the
//! version-1 file, the boot id.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use super::*;

/// Writes `uid`'s record in `state` under `boot`.
fn put(dir: &CheckpointDir, boot: &str, uid: &str, state: PrepareState, d: Durability) {
    dir.write(boot, uid, &record(state), d).unwrap();
}

fn record(state: PrepareState) -> ClaimRecord {
    ClaimRecord {
        namespace: "ns".into(),
        name: "c".into(),
        state,
        spec_file: "/var/run/cdi/x.json".into(),
        claim_dir: "/run/fgpu/claims/u1".into(),
        devices: vec![PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "n1".into(),
            device_name: "gpu-0".into(),
            share_id: Some("s1".into()),
            cdi_device_ids: vec!["gpu.fgpu.dev/claim=u1-gpu-0-s1".into()],
            gpu_uuid: "GPU-1".into(),
            memory_bytes: 1 << 30,
            cores: 30,
            enforcement: Default::default(),
            mig: None,
        }],
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn records_round_trip_one_private_file_each() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    let loaded = dir.load("boot-1").unwrap();
    assert_eq!(loaded.notes, [LoadNote::Missing]);
    assert!(loaded.claims.is_empty());
    assert_eq!(mode(dir.path()), 0o700);
    let records = Records::new(dir.clone(), "boot-1", loaded.claims);
    records
        .put(
            "u1",
            record(PrepareState::PrepareStarted),
            Durability::Atomic,
        )
        .unwrap();
    records
        .put(
            "u2",
            record(PrepareState::PrepareStarted),
            Durability::Fsync,
        )
        .unwrap();
    records
        .put(
            "u1",
            record(PrepareState::PrepareCompleted),
            Durability::Fsync,
        )
        .unwrap();
    assert_eq!(records.writes(), 3);
    // The same record again, not durable: nothing to write.
    records
        .put(
            "u1",
            record(PrepareState::PrepareCompleted),
            Durability::Atomic,
        )
        .unwrap();
    assert_eq!(records.writes(), 3);
    assert_eq!(
        names(dir.path()),
        ["u1.json", "u2.json"],
        "no temporary file left"
    );
    assert_eq!(mode(&dir.record_path("u1")), 0o600);
    let raw: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.record_path("u1")).unwrap()).unwrap();
    assert_eq!(raw["version"], CHECKPOINT_VERSION);
    assert_eq!(raw["bootId"], "boot-1");
    assert_eq!(raw["uid"], "u1");
    assert_eq!(raw["claim"]["state"], "PrepareCompleted");

    let back = dir.load("boot-1").unwrap();
    assert_eq!(back.notes, []);
    assert_eq!(back.claims, records.claims());

    assert!(records.remove("u1").unwrap());
    assert!(!records.remove("u1").unwrap(), "idempotent");
    assert_eq!(names(dir.path()), ["u2.json"]);
    assert_eq!(
        dir.load("boot-1")
            .unwrap()
            .claims
            .keys()
            .collect::<Vec<_>>(),
        ["u2"]
    );
}

#[test]
fn unknown_fields_are_ignored_and_missing_ones_defaulted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    dir.load("b").unwrap();
    fs::write(
        dir.record_path("u1"),
        r#"{"version": 7, "bootId": "b", "future": {"x": 1},
            "claim": {"namespace": "ns", "name": "c", "state": "PrepareStarted",
                      "newField": [1, 2],
                      "devices": [{"deviceName": "gpu-1", "extra": true}]}}"#,
    )
    .unwrap();
    let loaded = dir.load("b").unwrap();
    assert_eq!(loaded.notes, []);
    let rec = &loaded.claims["u1"];
    assert_eq!(rec.state, PrepareState::PrepareStarted);
    assert_eq!(rec.devices[0].device_name, "gpu-1");
    assert_eq!(rec.devices[0].memory_bytes, 0);

    // The version-1 file likewise.
    let file = CheckpointFile::new(tmp.path().join(CHECKPOINT_FILE));
    fs::write(
        file.path(),
        r#"{"version": 1, "bootId": "b", "future": {"x": 1},
            "claims": {"u1": {"namespace": "ns", "name": "c", "state": "PrepareCompleted",
                              "newField": [1, 2],
                              "devices": [{"deviceName": "gpu-1", "extra": true}]}}}"#,
    )
    .unwrap();
    let (cp, note) = file.load("b").unwrap();
    assert_eq!(note, None);
    assert_eq!(cp.version, 1);
    assert_eq!(cp.claims["u1"].state, PrepareState::PrepareCompleted);
    assert_eq!(cp.claims["u1"].devices[0].device_name, "gpu-1");
}

#[test]
fn records_of_another_boot_are_discarded_and_handed_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    dir.load("boot-1").unwrap();
    put(
        &dir,
        "boot-1",
        "u1",
        PrepareState::PrepareCompleted,
        Durability::Fsync,
    );
    put(
        &dir,
        "boot-2",
        "u2",
        PrepareState::PrepareCompleted,
        Durability::Fsync,
    );
    let loaded = dir.load("boot-2").unwrap();
    assert_eq!(loaded.claims.keys().collect::<Vec<_>>(), ["u2"]);
    match &loaded.notes[..] {
        [
            LoadNote::BootChanged {
                previous,
                discarded,
            },
        ] => {
            assert_eq!(previous, "boot-1");
            assert_eq!(discarded.keys().collect::<Vec<_>>(), ["u1"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(names(dir.path()), ["u2.json"]);

    // The version-1 file: the whole checkpoint is discarded.
    let file = CheckpointFile::new(tmp.path().join(CHECKPOINT_FILE));
    let mut cp = Checkpoint::new("boot-1");
    cp.claims
        .insert("u1".into(), record(PrepareState::PrepareCompleted));
    file.save(&cp).unwrap();
    let (fresh, note) = file.load("boot-2").unwrap();
    assert_eq!(fresh, Checkpoint::new("boot-2"));
    assert!(
        matches!(note, Some(LoadNote::BootChanged { previous, discarded })
            if previous == "boot-1" && discarded.contains_key("u1"))
    );
}

#[test]
fn corrupt_records_are_moved_aside_each_time_and_only_they_are_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    dir.load("b").unwrap();
    put(
        &dir,
        "b",
        "good",
        PrepareState::PrepareCompleted,
        Durability::Fsync,
    );
    for n in 1..=2 {
        fs::write(dir.record_path("u1"), b"{\"claim\": {\"name\": ").unwrap();
        let loaded = dir.load("b").unwrap();
        assert_eq!(loaded.claims.keys().collect::<Vec<_>>(), ["good"]);
        let [LoadNote::Corrupt { moved_to, error }] = &loaded.notes[..] else {
            panic!("{:?}", loaded.notes)
        };
        assert_eq!(*moved_to, dir.path().join(format!("u1.json.corrupt-{n}")));
        assert!(error.contains("EOF"), "{error}");
        assert!(!dir.record_path("u1").exists());
        assert!(moved_to.exists());
    }
    // Wrong types and a record under another claim's name are corruption too; moved-aside
    // files and names that are no UID are left alone.
    fs::write(
        dir.record_path("u2"),
        br#"{"bootId": "b", "claim": {"devices": {}}}"#,
    )
    .unwrap();
    fs::write(dir.record_path("u3"), br#"{"bootId": "b", "uid": "u4"}"#).unwrap();
    fs::write(dir.path().join("not a uid.json"), b"x").unwrap();
    // Something that cannot be read at all is moved aside too (no start that fails).
    fs::create_dir(dir.record_path("u5")).unwrap();
    let loaded = dir.load("b").unwrap();
    assert_eq!(loaded.notes.len(), 3, "{:?}", loaded.notes);
    assert!(
        loaded
            .notes
            .iter()
            .all(|n| matches!(n, LoadNote::Corrupt { .. })),
        "{:?}",
        loaded.notes
    );
    assert_eq!(
        names(dir.path()),
        [
            "good.json",
            "not a uid.json",
            "u1.json.corrupt-1",
            "u1.json.corrupt-2",
            "u2.json.corrupt-1",
            "u3.json.corrupt-1",
            "u5.json.corrupt-1"
        ]
    );

    // The version-1 file.
    let file = CheckpointFile::new(tmp.path().join(CHECKPOINT_FILE));
    fs::write(file.path(), b"{\"claims\": {\"u1\": ").unwrap();
    let (cp, note) = file.load("b").unwrap();
    assert_eq!(cp, Checkpoint::new("b"));
    let Some(LoadNote::Corrupt { moved_to, .. }) = note else {
        panic!("{note:?}")
    };
    assert_eq!(moved_to, tmp.path().join("checkpoint.json.corrupt-1"));
    assert!(!file.path().exists());
}

#[test]
fn interrupted_writes_are_removed_on_load() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    dir.load("b").unwrap();
    put(
        &dir,
        "b",
        "u1",
        PrepareState::PrepareStarted,
        Durability::Atomic,
    );
    // A crash between writing the temporary file and the rename.
    fs::write(dir.path().join(".u1.json.tmp"), b"{\"half").unwrap();
    fs::write(dir.path().join(".u2.json.tmp"), b"").unwrap();
    let loaded = dir.load("b").unwrap();
    assert_eq!(loaded.notes, []);
    assert_eq!(loaded.claims["u1"].state, PrepareState::PrepareStarted);
    assert_eq!(names(dir.path()), ["u1.json"]);
}

#[test]
fn replace_all_makes_the_directory_hold_exactly_the_claims() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    dir.load("b").unwrap();
    put(
        &dir,
        "b",
        "old",
        PrepareState::PrepareCompleted,
        Durability::Fsync,
    );
    put(
        &dir,
        "b",
        "kept",
        PrepareState::PrepareStarted,
        Durability::Fsync,
    );
    let claims: BTreeMap<String, ClaimRecord> = [
        ("kept".to_owned(), record(PrepareState::PrepareCompleted)),
        ("new".to_owned(), record(PrepareState::PrepareCompleted)),
    ]
    .into();
    dir.replace_all("b", &claims).unwrap();
    assert_eq!(names(dir.path()), ["kept.json", "new.json"]);
    assert_eq!(dir.load("b").unwrap().claims, claims);
}

#[test]
fn a_failed_write_fails_the_caller_and_changes_nothing_in_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    let records = Records::new(dir.clone(), "b", dir.load("b").unwrap().claims);
    records
        .put(
            "u1",
            record(PrepareState::PrepareStarted),
            Durability::Atomic,
        )
        .unwrap();
    fs::remove_dir_all(dir.path()).unwrap();
    let e = records
        .put(
            "u1",
            record(PrepareState::PrepareCompleted),
            Durability::Fsync,
        )
        .unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "checkpoint {}: cannot write the temporary file",
            dir.record_path("u1").display()
        )),
        "{e}"
    );
    assert_eq!(
        records.claims()["u1"].state,
        PrepareState::PrepareStarted,
        "memory is never ahead of the disk"
    );
    dir.load("b").unwrap();
    records
        .put(
            "u1",
            record(PrepareState::PrepareCompleted),
            Durability::Fsync,
        )
        .unwrap();
    assert_eq!(
        dir.load("b").unwrap().claims["u1"].state,
        PrepareState::PrepareCompleted
    );
}

#[test]
fn records_of_different_claims_are_written_in_parallel() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
    let records = std::sync::Arc::new(Records::new(
        dir.clone(),
        "b",
        dir.load("b").unwrap().claims,
    ));
    // Eight claims recorded from eight threads at once, twenty times each (started,
    // completed, removed, and again, as prepare and unprepare do): every file ends with
    // its claim's last record, and the memory agrees with the disk.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let r = records.clone();
            std::thread::spawn(move || {
                for round in 0..20 {
                    let uid = format!("u{i}");
                    let state = match round % 3 {
                        0 => PrepareState::PrepareStarted,
                        1 => PrepareState::PrepareCompleted,
                        _ => {
                            assert!(r.remove(&uid).unwrap());
                            continue;
                        }
                    };
                    r.put(&uid, record(state), Durability::Fsync).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let on_disk = dir.load("b").unwrap().claims;
    assert_eq!(on_disk.len(), 8);
    assert_eq!(on_disk, records.claims());
    assert!(
        on_disk
            .values()
            .all(|r| r.state == PrepareState::PrepareCompleted)
    );
    assert_eq!(records.writes(), 160);
}

#[test]
fn boot_id_is_read_and_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("boot_id");
    fs::write(&p, "1b2c-3d\n").unwrap();
    assert_eq!(read_boot_id(&p).unwrap(), "1b2c-3d");
    fs::write(&p, "\n").unwrap();
    assert!(
        read_boot_id(&p)
            .unwrap_err()
            .to_string()
            .contains("is empty")
    );
    assert!(read_boot_id(&dir.path().join("nope")).is_err());
}
