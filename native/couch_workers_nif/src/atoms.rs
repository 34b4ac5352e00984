//! The atoms the NIF sends and matches.

rustler::atoms! {
    ok,
    error,
    undefined,
    nil,
    true_ = "true",
    false_ = "false",
    null,
    panic,
    // lifecycle
    already_started,
    not_started,
    starting,
    stopping,
    badconfig,
    // config keys
    store,
    embedded,
    fdb,
    runtime_threads,
    reaper_max_interval_ms,
    tx_timeout_ms,
    // stats keys
    running,
    heartbeats,
    watchers,
    reapers,
    registrations,
    watches,
    // workers
    timeout,
    invalid_timeout,
    invalid_options,
    // messages
    couch_workers_log,
    couch_workers_membership_changed,
}
