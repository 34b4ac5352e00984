%% @doc couch_workers: workers, their membership, and a job queue, for
%% CouchDB nodes that share one store. docs/api.md is the contract:
%% every function, message, option and error.
%%
%% Every call that returns has finished its write: what it wrote is
%% visible to every node. Bad shapes (a non-binary type or id, non-map
%% options, a non-pid) raise `badarg'; options that JSON cannot hold are
%% `{error, invalid_options}', a bad `timeout' `{error, invalid_timeout}',
%% keys and values over FoundationDB's limits `{error, key_too_large}' and
%% `{error, value_too_large}'. Unknown or stale references are `ok'
%% (`job_accept/2': `{error, not_found}').
-module(couch_workers).

-export([
    worker_register/4,
    worker_unregister/1,
    membership_subscribe/3,
    membership_unsubscribe/1,
    get_workers/1,
    stats/0
]).

%% The job queue (implemented in couch_workers_jobs).
-export([
    job_add/4,
    job_add/5,
    job_add_many/2,
    job_accept/2,
    job_update/2,
    job_finish/2,
    job_finish_accept/3,
    job_cancel/2,
    job_remove/2,
    job_get/2,
    job_get/3,
    job_resubmit/5,
    job_update/3,
    job_finish/3,
    job_cancel/3,
    job_pending_count/1,
    job_subscribe/3,
    job_unsubscribe/1,
    job_fail/3,
    job_release/2,
    job_resubmit/4,
    job_remove/3,
    job_counts/1,
    job_types/0,
    job_list/2,
    job_wait/4,
    job_pause/1,
    job_resume/1
]).

%% Job type settings (implemented in couch_workers_types).
-export([
    job_type_get/1,
    job_type_set/2
]).

%% Operations (implemented in couch_workers_ops and couch_workers_metrics).
-export([
    worker_types/0,
    workers/1,
    metrics/0,
    metrics/1
]).

%% Leadership (implemented in couch_workers_leader).
-export([leader/1]).

%% Recurring jobs (implemented in couch_workers_schedules).
-export([schedule_set/5, schedule_remove/2, schedules/1]).

-export_type([worker_type/0, worker_id/0, workers/0, vs/0]).
-export_type([job_type/0, job_id/0, job/0, job_handle/0, job_state/0]).
-export_type([job_run/0]).

-type worker_type() :: binary().
-type worker_id() :: binary().
%% Options of each live worker, decoded from JSON (binary keys).
-type workers() :: #{worker_id() => map()}.
%% A versionstamp: opaque; a later one compares greater.
-type vs() :: binary().

-type job_type() :: binary().
-type job_id() :: binary().
-type job_state() :: scheduled | pending | running | finished | canceled | failed.
%% A job as `job_get/2' and subscriptions give it. `info' and `result' come
%% back from JSON with binary keys; `vs' is the versionstamp of its last
%% change (12 bytes; a later change compares greater); `attempts' counts
%% accepts; `cancel_requested' says that a cancel waits for the worker's
%% next `job_update/2'.
-type job() :: #{
    type := job_type(),
    id := job_id(),
    state := job_state(),
    worker := worker_id() | null,
    priority := integer(),
    info := map(),
    result := map() | null,
    attempts := non_neg_integer(),
    vs := vs(),
    cancel_requested := boolean(),
    error := map() | null,
    max_attempts := pos_integer() | infinity,
    run_at := non_neg_integer() | null,
    keep := non_neg_integer() | infinity,
    unique := binary() | null,
    group := binary() | null,
    %% The job's own; `null': its type's (`job_type_get/1').
    activity_timeout := pos_integer() | infinity | null,
    %% Only in the job `job_get/2' returns: its last 10 runs, newest first.
    history => [job_run()]
}.
%% One run of a job: `ended_at' and `error' `null' when there is none;
%% times are Unix ms on the writing node's wall clock (informational).
-type job_run() :: #{
    attempt := pos_integer(),
    worker := worker_id(),
    started_at := non_neg_integer(),
    ended_at := non_neg_integer() | null,
    outcome := running | finished | failed | retried | released | lost | canceled | timeout,
    error := map() | null
}.
%% What `job_accept/2' and `job_update/2' return: the job and `token', the
%% 16-byte fencing token of that one accept. `job_update/2' and
%% `job_finish/2' take it; a map without a valid `type', `id', `worker'
%% and `token' (a `job()' from `job_get/2', say) raises `badarg'.
-type job_handle() :: #{
    type := job_type(),
    id := job_id(),
    state := job_state(),
    worker := worker_id(),
    priority := integer(),
    info := map(),
    result := null,
    attempts := pos_integer(),
    vs := vs(),
    cancel_requested := boolean(),
    error := map() | null,
    max_attempts := pos_integer() | infinity,
    run_at := null,
    keep := non_neg_integer() | infinity,
    token := <<_:128>>
}.

%% Called (in a process of the subscription's own) on every membership
%% change of a subscription made with a module.
-callback couch_workers_membership_update(
    WorkerType :: worker_type(), Workers :: workers(), VS :: vs(), Ref :: reference()
) -> any().

%% @doc Registers worker `Id' of `WorkerType' for `Pid'. `Opts' (a map
%% JSON can hold) is what other nodes see; its `timeout' (atom or binary
%% key; a positive integer, seconds; default 15) is the health timeout.
%% The same `(WorkerType, Id)' registered again from this node returns the
%% same `Ref'. When `Pid' exits, the worker is unregistered.
-spec worker_register(worker_type(), worker_id(), map(), pid()) -> reference() | {error, term()}.
worker_register(WorkerType, Id, Opts, Pid) when
    is_binary(WorkerType), is_binary(Id), is_map(Opts), is_pid(Pid)
->
    case couch_workers_local:register_worker(WorkerType, Id, Opts, Pid) of
        {error, badarg} -> erlang:error(badarg);
        Result -> Result
    end;
worker_register(_WorkerType, _Id, _Opts, _Pid) ->
    erlang:error(badarg).

%% @doc Removes the worker of `Ref' (unknown or stale `Ref': `ok').
-spec worker_unregister(reference()) -> ok | {error, timeout}.
worker_unregister(Ref) when is_reference(Ref) ->
    couch_workers_local:unregister_worker(Ref);
worker_unregister(_Ref) ->
    ok.

%% @doc Subscribes `Pid' to the membership of `WorkerType': with `Module'
%% each change is a call of `Module:couch_workers_membership_update/4',
%% with `nil' the message `{couch_workers_membership, WorkerType, Workers,
%% VS, Ref}' to `Pid'. The current membership comes once right away (also
%% `#{}'). `Pid' owns the subscription: its exit ends it.
-spec membership_subscribe(worker_type(), nil | module(), pid()) -> reference() | {error, term()}.
membership_subscribe(WorkerType, Module, Pid) when
    is_binary(WorkerType), is_atom(Module), is_pid(Pid)
->
    couch_workers_global:subscribe(WorkerType, Module, Pid);
membership_subscribe(_WorkerType, _Module, _Pid) ->
    erlang:error(badarg).

%% @doc Ends a subscription: no delivery for `Ref' arrives after this
%% returns (deliveries already in the caller's mailbox are flushed).
-spec membership_unsubscribe(reference()) -> ok.
membership_unsubscribe(Ref) when is_reference(Ref) ->
    ok = couch_workers_global:unsubscribe(Ref),
    flush_membership(Ref);
membership_unsubscribe(_Ref) ->
    ok.

%% @doc The node-local membership of `WorkerType' as last delivered;
%% `not_found' when no subscription on this node covers it.
-spec get_workers(worker_type()) -> {ok, vs(), workers()} | {error, not_found}.
get_workers(WorkerType) ->
    couch_workers_global:get_workers(WorkerType).

%% @doc Live counts of the Rust side: `heartbeats', `watchers', `reapers'
%% (tasks of the running node), `registrations' and `watches' (live NIF
%% handles), `running', `runtime_threads'; of the job queue:
%% `job_dispatchers', `job_waiters' (acceptors waiting in them),
%% `job_watchers' (one per subscribed job), `job_sweepers' (tasks of the
%% node), `job_subscriptions' and `accept_waiters' (live NIF handles).
-spec stats() -> #{atom() => term()}.
stats() ->
    couch_workers_nif:stats().

%% ---- jobs ------------------------------------------------------------------
%%
%% Shapes (a non-binary type or id, a non-map info, result or options, a
%% `Job' that is not a handle, a non-pid) raise `badarg'. Values: a
%% `priority' that is not an integer in the 64-bit range is
%% `{error, invalid_priority}'; a `timeout' that is not a non-negative
%% integer `{error, invalid_timeout}'; an info or result JSON cannot hold
%% `{error, invalid_info}' / `{error, invalid_result}'; ids and types over
%% 10,000 bytes `{error, key_too_large}'; info or result over 100,000
%% bytes of JSON `{error, value_too_large}'. Nothing is written then.
%% Store failures are `{error, Name}'; `{error, timeout}' when no answer
%% came within the store's budget plus a margin.

%% @doc Adds a pending job. `Opts': `priority' (integer, default 0; lower
%% runs first; first in, first out within a priority). An id that exists
%% in any state is `already_exists'.
-spec job_add(job_type(), job_id(), map(), map()) -> ok | {error, already_exists | term()}.
job_add(JobType, JobId, Info, Opts) ->
    couch_workers_observe:call(job_added, JobType, JobId, fun() -> couch_workers_jobs:add(JobType, JobId, Info, Opts) end).

%% @doc Adds every job or none, in one transaction; `already_exists' lists
%% every id that exists (or repeats in the list). A batch one transaction
%% cannot hold (over 65,536 jobs or about 10 MB) is
%% `{error, transaction_too_large}'.
-spec job_add_many(job_type(), [{job_id(), map(), map()}]) ->
    ok | {error, {already_exists, [job_id()]} | term()}.
job_add_many(JobType, Jobs) ->
    couch_workers_observe:call(job_added_many, JobType, Jobs, fun() -> couch_workers_jobs:add_many(JobType, Jobs) end).

%% @doc Takes the next pending job of the worker's type for the worker
%% registered on this node as `WorkerRef'. `Opts': `timeout' (ms, default
%% 0) to wait for a job pushed meanwhile. `not_found': no job in time, or
%% `WorkerRef' is unknown or stale. The handle is good for this accept
%% only.
-spec job_accept(reference(), map()) -> {ok, job_handle()} | {error, not_found | term()}.
job_accept(WorkerRef, Opts) ->
    couch_workers_observe:call(job_accepted, none, none, fun() -> couch_workers_jobs:accept(WorkerRef, Opts) end).

%% @doc Replaces the info of the job `Job' holds; returns the new handle.
%% `canceled': a cancel was requested (the job is now canceled and no
%% longer the worker's); `not_owner': this accept no longer holds the job;
%% `not_found': it was removed.
-spec job_update(job_handle(), map()) -> {ok, job_handle()} | {error, canceled | not_owner | not_found | term()}.
job_update(Job, Info) ->
    couch_workers_jobs:update(Job, Info).

%% @doc Finishes the job `Job' holds, with `Result'.
-spec job_finish(job_handle(), map()) -> ok | {error, not_owner | not_found | term()}.
job_finish(Job, Result) ->
    couch_workers_observe:call(job_finished, none, Job, fun() -> couch_workers_jobs:finish(Job, Result) end).

%% @doc Finishes the job `Job' holds, with `Result', and in the same
%% transaction takes the next pending job for the worker registered on
%% this node as `WorkerRef', as `job_accept(WorkerRef, #{timeout => 0})'
%% would: one store transaction and one call per job for a busy worker.
%% `{ok, none}': the job is finished and none was taken (none pending,
%% the type paused, or `WorkerRef' unknown or stale). An error is the
%% finish's: nothing was written and nothing taken.
-spec job_finish_accept(job_handle(), map(), reference()) ->
    {ok, job_handle() | none} | {error, not_owner | not_found | term()}.
job_finish_accept(Job, Result, WorkerRef) ->
    couch_workers_observe:call(job_finish_accepted, none, Job, fun() ->
        couch_workers_jobs:finish_accept(Job, Result, WorkerRef)
    end).

%% @doc Cancels a pending job at once; asks a running one's worker to stop
%% (its next `job_update/2' is `{error, canceled}'); a finished or
%% canceled one is left as it is (`ok').
-spec job_cancel(job_type(), job_id()) -> ok | {error, not_found | term()}.
job_cancel(JobType, JobId) ->
    couch_workers_observe:call(job_canceled, JobType, JobId, fun() -> couch_workers_jobs:cancel(JobType, JobId) end).

%% @doc Removes a job in any state (a running one's worker is then
%% refused with `not_found').
-spec job_remove(job_type(), job_id()) -> ok | {error, not_found | term()}.
job_remove(JobType, JobId) ->
    couch_workers_observe:call(job_removed, JobType, JobId, fun() -> couch_workers_jobs:remove(JobType, JobId) end).

%% ---- inside the caller's FoundationDB transaction (couch_workers_tx) ----------
%%
%% `Tx' is an erlfdb transaction, a map holding one under `tx' (fabric2's
%% `Db' map), or `undefined' (the call without `Tx'). Each call answers as
%% its own-transaction twin would at `Tx''s read version; its writes land
%% iff `Tx' commits; the job's record joins `Tx''s read conflict set. An
%% erlfdb error is raised for the caller's `erlfdb:transactional/2' to
%% retry. `{error, fdb_only}' on the embedded store. docs/api.md.

%% @doc `job_add/4' in `Tx'.
-spec job_add(couch_workers_tx:tx(), job_type(), job_id(), map(), map()) -> ok | {error, already_exists | term()}.
job_add(Tx, JobType, JobId, Info, Opts) ->
    couch_workers_tx:add(Tx, JobType, JobId, Info, Opts).

%% @doc `job_get/2' in `Tx'. A job written by an earlier call in `Tx' is
%% read as that call left it (its `vs' known only at the commit).
-spec job_get(couch_workers_tx:tx(), job_type(), job_id()) -> {ok, job()} | {error, not_found | term()}.
job_get(Tx, JobType, JobId) ->
    couch_workers_tx:get(Tx, JobType, JobId).

%% @doc `job_resubmit/4' in `Tx'.
-spec job_resubmit(couch_workers_tx:tx(), job_type(), job_id(), map(), map()) -> ok | {error, term()}.
job_resubmit(Tx, JobType, JobId, Info, Opts) ->
    couch_workers_tx:resubmit(Tx, JobType, JobId, Info, Opts).

%% @doc `job_update/2' in `Tx': `{ok, Handle}' in a transaction that
%% commits proves the job was still this handle's at the commit. The
%% handle's `vs' is not known inside `Tx' (12 bytes, the first ten 255).
-spec job_update(couch_workers_tx:tx(), job_handle(), map()) -> {ok, job_handle()} | {error, term()}.
job_update(Tx, Job, Info) ->
    couch_workers_tx:update(Tx, Job, Info).

%% @doc `job_finish/2' in `Tx'.
-spec job_finish(couch_workers_tx:tx(), job_handle(), map()) -> ok | {error, term()}.
job_finish(Tx, Job, Result) ->
    couch_workers_tx:finish(Tx, Job, Result).

%% @doc `job_cancel/2' in `Tx'.
-spec job_cancel(couch_workers_tx:tx(), job_type(), job_id()) -> ok | {error, not_found | term()}.
job_cancel(Tx, JobType, JobId) ->
    couch_workers_tx:cancel(Tx, JobType, JobId).

%% @doc The job (no token: not a handle).
-spec job_get(job_type(), job_id()) -> {ok, job()} | {error, not_found | term()}.
job_get(JobType, JobId) ->
    couch_workers_jobs:get(JobType, JobId).

%% @doc The exact number of pending jobs of `JobType' (a counter: cheap at
%% any queue size).
-spec job_pending_count(job_type()) -> non_neg_integer() | {error, term()}.
job_pending_count(JobType) ->
    couch_workers_jobs:pending_count(JobType).

%% @doc Subscribes `Pid' (a local process) to the job: returns the job as
%% it is now, then `{couch_workers_job, Ref, Job}' goes to `Pid' on every
%% change, and `{couch_workers_job, Ref, removed}' when the job is removed
%% (the end of the subscription). `Pid''s exit ends it.
-spec job_subscribe(job_type(), job_id(), pid()) -> {ok, reference(), job()} | {error, not_found | term()}.
job_subscribe(JobType, JobId, Pid) ->
    couch_workers_jobs:subscribe(JobType, JobId, Pid).

%% @doc Ends a job subscription: no message for `Ref' arrives after this
%% returns (those already in the caller's mailbox are flushed). Unknown
%% or stale `Ref': `ok'.
-spec job_unsubscribe(reference()) -> ok.
job_unsubscribe(Ref) ->
    couch_workers_jobs:unsubscribe(Ref).

-spec job_fail(job_handle(), map(), map()) -> ok | {error, not_owner | not_found | term()}.
job_fail(Job, Error, Opts) ->
    couch_workers_observe:call(job_failed, none, {Job, Error, Opts}, fun() -> couch_workers_jobs:fail(Job, Error, Opts) end).

-spec job_release(job_handle(), map()) -> ok | {error, not_owner | not_found | term()}.
job_release(Job, Opts) ->
    couch_workers_observe:call(job_released, none, Job, fun() -> couch_workers_jobs:release(Job, Opts) end).

-spec job_resubmit(job_type(), job_id(), map(), map()) -> ok | {error, changed | term()}.
job_resubmit(JobType, JobId, Info, Opts) ->
    couch_workers_observe:call(job_resubmitted, JobType, JobId, fun() ->
        couch_workers_jobs:resubmit(JobType, JobId, Info, Opts)
    end).

%% @doc `job_remove(JobType, JobId, Opts)' (`if_vs'), or, with a `Tx'
%% first, `job_remove/2' in the caller's transaction (see `job_add/5').
-spec job_remove(job_type() | couch_workers_tx:tx(), job_id() | job_type(), map() | job_id()) ->
    ok | {error, not_found | changed | term()}.
job_remove(JobType, JobId, Opts) when is_binary(JobType) ->
    couch_workers_observe:call(job_removed, JobType, JobId, fun() -> couch_workers_jobs:remove(JobType, JobId, Opts) end);
job_remove(Tx, JobType, JobId) ->
    couch_workers_tx:remove(Tx, JobType, JobId).

-spec job_counts(job_type()) -> #{job_state() => non_neg_integer()} | {error, term()}.
job_counts(JobType) ->
    couch_workers_jobs:counts(JobType).

-spec job_types() -> [job_type()] | {error, term()}.
job_types() ->
    couch_workers_jobs:types().

-spec job_list(job_type(), map()) -> {ok, [job()], done | term()} | {error, term()}.
job_list(JobType, Opts) ->
    couch_workers_jobs:list(JobType, Opts).

-spec job_wait(job_type(), job_id(), [job_state()], timeout()) -> {ok, job()} | {error, timeout | not_found | term()}.
job_wait(JobType, JobId, States, Timeout) ->
    couch_workers_jobs:wait(JobType, JobId, States, Timeout).

-spec job_pause(job_type()) -> ok | {error, term()}.
job_pause(JobType) ->
    couch_workers_jobs:pause(JobType).

-spec job_resume(job_type()) -> ok | {error, term()}.
job_resume(JobType) ->
    couch_workers_jobs:resume(JobType).

%% ---- job type settings -------------------------------------------------------

%% @doc The type's settings, cluster-wide, every key present:
%% `#{activity_timeout, max_running, max_running_per_group}', each a
%% positive integer or `infinity' (the default). See couch_workers_types.
-spec job_type_get(job_type()) -> couch_workers_types:settings() | {error, term()}.
job_type_get(JobType) ->
    couch_workers_types:get(JobType).

%% @doc Changes the settings named in `Settings' for the whole cluster;
%% the others keep their values. `{error, {bad_setting, Key}}' (nothing
%% written) for an unknown key or a value that is not a positive integer
%% or `infinity'.
-spec job_type_set(job_type(), couch_workers_types:settings()) -> ok | {error, term()}.
job_type_set(JobType, Settings) ->
    couch_workers_types:set(JobType, Settings).

%% ---- operations --------------------------------------------------------------

%% @doc The worker types that have registered workers now, anywhere in the
%% cluster (read from the store; no subscription needed).
-spec worker_types() -> [worker_type()] | {error, term()}.
worker_types() ->
    couch_workers_ops:worker_types().

%% @doc Every registered worker of `WorkerType' anywhere in the cluster,
%% read from the store: its options, health timeout (seconds),
%% `heartbeat_age_ms' (store versions since its last heartbeat's commit
%% / 1,000: about ms, informational) and `running' (its running jobs).
%% A non-binary type raises `badarg'.
-spec workers(worker_type()) -> [couch_workers_ops:worker_info()] | {error, term()}.
workers(WorkerType) ->
    couch_workers_ops:workers(WorkerType).

%% @doc This node's counters since the app started and its latency
%% summaries (microseconds), per type: `#{node, store => #{transactions,
%% conflicts, retries, failures}, types => #{Type => #{jobs_added, ...,
%% latency => #{accept_wait | add | finish => #{count, sum_us, p50_us,
%% p99_us, max_us}}}}}'. See couch_workers_metrics.
-spec metrics() -> map().
metrics() ->
    couch_workers_metrics:metrics().

%% @doc `metrics/0' in the Prometheus text exposition format, with each
%% job type's running jobs and `max_running' (read from the store).
-spec metrics(prometheus) -> iodata().
metrics(prometheus) ->
    Metrics = couch_workers_metrics:metrics(),
    couch_workers_prometheus:format(Metrics#{running => couch_workers_status:running_limits()});
metrics(_Format) ->
    erlang:error(badarg).

flush_membership(Ref) ->
    receive
        {couch_workers_membership, _Type, _Workers, _VS, Ref} -> flush_membership(Ref)
    after 0 -> ok
    end.

%% ---- leadership ----------------------------------------------------------------

%% @doc The leader of `WorkerType': its member with the oldest current
%% registration, read from the store at one version. `Epoch' names this
%% leadership (a later leader's compares greater); `if_leader =>
%% {WorkerType, Epoch}' on `job_add/4' and `job_resubmit/4' writes only
%% while it leads. The leader's owner gets `{couch_workers_leader, Ref,
%% Epoch}' when it becomes leader and `{couch_workers_leader_lost, Ref,
%% Epoch}' when it stops.
-spec leader(worker_type()) -> {ok, worker_id(), binary()} | {error, not_found | term()}.
leader(WorkerType) ->
    couch_workers_leader:leader(WorkerType).

%% ---- recurring jobs ----------------------------------------------------------

%% @doc Sets (or replaces, from its next due slot) the schedule
%% `ScheduleId' of `JobType': each due slot `T' (Unix ms) creates one job
%% with id `<<ScheduleId/binary, "@", (integer_to_binary(T))/binary>>',
%% `Info' and the options of `Opts' (those of `job_add/4', and
%% `if_leader'). `Spec': `#{every => Ms}' (at least 1000) or `#{cron =>
%% <<"m h dom mon dow">>}' (UTC), with optional `start_at' (Unix ms),
%% `overlap' (default `false') and `catch_up' (`latest' | `none' |
%% `all'). A bad spec is `{error, {bad_schedule, Why}}'.
-spec schedule_set(job_type(), binary(), map(), map(), map()) ->
    ok | {error, {bad_schedule, binary()} | not_leader | term()}.
schedule_set(JobType, ScheduleId, Spec, Info, Opts) ->
    couch_workers_schedules:set(JobType, ScheduleId, Spec, Info, Opts).

%% @doc Removes a schedule; the jobs its slots created stay.
-spec schedule_remove(job_type(), binary()) -> ok | {error, not_found | term()}.
schedule_remove(JobType, ScheduleId) ->
    couch_workers_schedules:remove(JobType, ScheduleId).

%% @doc The schedules of `JobType': `[#{id, spec, info, opts, next_run_at,
%% last_run => JobId | null}]', in id order.
-spec schedules(job_type()) -> [map()] | {error, term()}.
schedules(JobType) ->
    couch_workers_schedules:list(JobType).
