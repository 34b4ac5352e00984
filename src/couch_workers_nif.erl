%% @doc The NIF stubs of couch_workers (Rust crate `couch_workers_nif`).
%%
%% Quick NIFs answer at once. NIFs that touch the store take a reference
%% made by the caller, return `ok' at once (or `{error, Reason}' when
%% nothing was started) and later send exactly one `{Ref, Result}' to the
%% calling process; `wait/2' waits for it (as erlfdb's `wait/2'). A panic
%% in Rust answers `{Ref, {error, {panic, Message}}}'.
%%
%% A NIF never holds a normal scheduler long. `job_add/5', `job_update/3',
%% `job_finish/3', `job_finish_accept/4' and `worker_register/4' convert the caller's map (up to
%% 100 KB of terms) to JSON: on the calling scheduler they convert at most
%% a budget of terms (2,000, a binary counting one more per 16 bytes:
%% about 0.3 ms at most) and past it answer `dirty' at once, having done
%% nothing. Their `_dirty' twins run on a
%% dirty CPU scheduler and convert any size; otherwise the twins answer
%% alike. Call them through `budgeted/2', which does the one and then, if
%% need be, the other: small maps (nearly all) stay on the fast path. See
%% the NIF crate's `json.rs'. The other NIFs that touch the store only
%% check small arguments and hand the request to the Rust runtime; its
%% threads run under Linux's `SCHED_BATCH', so that the thread a NIF wakes
%% never preempts the calling scheduler thread while it builds a big
%% reply (the NIF crate's `runtime.rs'). test/couch_workers_sched_tests.erl
%% times every NIF that runs on a normal scheduler.
%%
%% ```
%% start(Ref, Config)               -> ok | {error, already_started | stopping | {badconfig, Key} | runtime_failed}
%%     Config = #{store, runtime_threads, reaper_max_interval_ms, tx_timeout_ms, embedded_safety_look_ms}
%%     (each optional; embedded_safety_look_ms =< 86400000; README "Configuration")
%%                                       then {Ref, ok | {error, Name}}   (Name: the store's error, e.g. store_io)
%% stop(Ref)                        -> ok | {error, not_started | starting | stopping}
%%                                       then {Ref, ok}   (after every task of the node ended)
%% stats()                          -> #{running, heartbeats, watchers, reapers, registrations, watches, runtime_threads,
%%                                       job_dispatchers, job_waiters, job_watchers, job_sweepers,
%%                                       job_subscriptions, accept_waiters}
%% set_log_pid(Pid | undefined)     -> ok      log events: {couch_workers_log, Level, What, Fields}
%% worker_register(Ref, Type, Id, Opts) -> ok | {error, _} | dirty  then {Ref, {ok, Registration} | {error, Name}}
%% worker_unregister(Ref, Registration) -> ok | {error, not_started}  then {Ref, ok | {error, Name}}
%% worker_notify(Registration, Owner, Tag) -> ok      Tag: a reference; then, found by a heartbeat:
%%     reaped (and registered again): {couch_workers_worker_reaped, Tag} to Owner
%%     replaced by another registration: {couch_workers_worker_lost, Tag, superseded} to Owner and
%%     {couch_workers_worker_superseded, Tag} to the caller (again to a later caller; see workers.rs)
%%     the node's heartbeat service keeps failing: {couch_workers_worker_at_risk, Tag, heartbeat_failing} to Owner
%%     a running job taken back for its activity timeout: {couch_workers_job_timeout, Tag, JobType, JobId} to Owner
%% worker_remove_dead(Ref, Registration) as worker_unregister, for an owner that died: its running
%%     jobs fail with worker_lost instead of being released
%% membership_watch(Type, Tag)      -> {ok, Watch} | {error, Name}     Tag: an atom or a reference
%%     then {couch_workers_membership_changed, Tag, Type, VS, Workers} on the first read, and on every
%%     change that or {couch_workers_membership_delta, Tag, Type, VS, Joined, Left}: the changes since the
%%     message before (Joined = [{Id, Opts}] to put, Left = [Id] to remove; see membership.rs)
%% membership_unwatch(Watch)        -> ok
%% test_panic(Ref)                  -> ok | {error, not_started}  then {Ref, {error, {panic, Msg}}}
%% test_thread_wait_ns()            -> Ns | undefined  the calling thread's run-queue wait so far (Linux)
%%
%% job_add(Ref, Type, Id, Info, Opts)         -> ok | {error, _} | dirty  then {Ref, ok | {error, Name}}
%%     Opts = {Priority, Schedule, MaxAttempts, Keep}, each `undefined' when not given,
%%     or that and Unique, or that and {Unique, Group, ActivityTimeout};
%%     Schedule = {delay, Ms} | {run_at, UnixMs}; MaxAttempts = pos_integer() | infinity;
%%     Keep = non_neg_integer() (s) | infinity
%% job_add_many(Ref, Type, [{Id, Info, Opts}])
%%                                            -> ok | {error, _}  then {Ref, ok | {error, {already_exists, [Id]}} | {error, Name}}
%% job_accept(Ref, Type, Worker, TimeoutMs)   -> {ok, Waiter} | {error, _}  then {Ref, {ok, Handle} | {error, Name}}
%%     Worker = Id (whichever registration holds it) | Registration (of Type:
%%     only while it holds the id; not_found once it ended, also if the id was
%%     registered again meanwhile)
%% job_accept_abandon(Waiter)                 -> abandoned | delivered
%% job_update(Ref, Handle, Info)              -> ok | {error, _} | dirty  then {Ref, {ok, Handle} | {error, Name}}
%% job_finish(Ref, Handle, Result)            -> ok | {error, _} | dirty  then {Ref, ok | {error, Name}}
%% job_finish_accept(Ref, Handle, Result, Registration)
%%                                            -> {ok, Waiter} | {error, _} | dirty  then {Ref, {ok, NextHandle} | {ok, none} | {error, Name}}
%%     finishes Handle's job and takes the next for Registration in one transaction
%%     (none: finished, nothing taken); Waiter as job_accept's
%% job_fail(Ref, Handle, Error, Retry)        -> ok | {error, _} | dirty  then {Ref, ok | {error, Name}}
%%     Retry = false | {delay, Ms} | {backoff, BaseMs, MaxMs}
%% job_release(Ref, Handle, Info | undefined, Opts)
%%                                            -> ok | {error, _} | dirty  then {Ref, ok | {error, Name}}
%% job_resubmit(Ref, Type, Id, Info, Opts, VS | undefined)
%%                                            -> ok | {error, _} | dirty  then {Ref, ok | {error, changed | Name}}
%% job_remove_if(Ref, Type, Id, VS | undefined) -> ok | {error, _}  then {Ref, ok | {error, not_found | changed | Name}}
%% job_counts(Ref, Type)                      -> ok | {error, _}  then {Ref, {ok, #{State => N}} | {error, Name}}
%% job_types(Ref)                             -> ok | {error, _}  then {Ref, {ok, [Type]} | {error, Name}}
%% job_list(Ref, Type, all | [State], Limit, After | undefined)
%%                                            -> ok | {error, _}  then {Ref, {ok, [Job], LastId | done} | {error, Name}}
%% job_set_paused(Ref, Type, Bool)            -> ok | {error, _}  then {Ref, ok | {error, Name}}
%% job_cancel(Ref, Type, Id)                  -> ok | {error, _}  then {Ref, ok | {error, Name}}
%% job_remove(Ref, Type, Id)                  -> ok | {error, _}  then {Ref, ok | {error, Name}}
%% job_get(Ref, Type, Id)                     -> ok | {error, _}  then {Ref, {ok, Job} | {error, Name}}
%% job_pending_count(Ref, Type)               -> ok | {error, _}  then {Ref, {ok, N} | {error, Name}}
%% job_subscribe(Ref, Type, Id, Pid, SubRef)  -> ok | {error, _}  then {Ref, {ok, Subscription, Job} | {error, Name}}
%%     then {couch_workers_job, SubRef, Job | removed} to Pid, and
%%     {couch_workers_job_ended, SubRef} after `removed' to the process registered as couch_workers_jobs_subs when it is sent
%% job_unsubscribe(Subscription)              -> ok      (nothing of it is sent after this returns)
%%
%% ops_worker_types(Ref)                      -> ok | {error, _}  then {Ref, {ok, [Type]} | {error, Name}}
%% ops_workers(Ref, Type)                     -> ok | {error, _}  then {Ref, {ok, [#{id, opts, timeout, heartbeat_age_ms, running}]} | {error, Name}}
%% ops_job_paused(Ref, Type)                  -> ok | {error, _}  then {Ref, {ok, boolean()} | {error, Name}}
%% ops_store_counters()                       -> #{transactions, conflicts, retries, failures, services_restarted, services_failing}   (the retry loop's and the supervisor's, since the VM started)
%%
%% worker_register_dirty/4, job_add_dirty/5, job_update_dirty/3, job_finish_dirty/3,
%% job_finish_accept_dirty/4, job_fail_dirty/4, job_release_dirty/4, job_resubmit_dirty/6
%%                                            the DirtyCpu twins: as above, never `dirty'
%% job_tx_session(ReadVersion)                -> Session: one attempt of a caller's transaction
%% job_tx_add(Ref, Session, Type, Id, Info, Opts) -> {ok, Call} | {error, fdb_only | _} | dirty
%% job_tx_update(Ref, Session, Handle, Info)  -> {ok, Call} | {error, fdb_only | _} | dirty
%% job_tx_finish(Ref, Session, Handle, Result) -> {ok, Call} | {error, fdb_only | _} | dirty
%% job_tx_resubmit(Ref, Session, Type, Id, Info, Opts, IfVs) -> {ok, Call} | {error, fdb_only | _} | dirty
%% job_tx_get(Ref, Session, Type, Id)         -> {ok, Call} | {error, fdb_only | _}
%% job_tx_remove(Ref, Session, Type, Id, IfVs) -> {ok, Call} | {error, fdb_only | _}
%% job_tx_cancel(Ref, Session, Type, Id)      -> {ok, Call} | {error, fdb_only | _}
%%     then {Ref, Seq, Request} (Seq = 0, 1, ...), each performed on the caller's erlfdb transaction,
%%     a read answered with job_tx_answer(Call, Seq, Answer), and {Ref, N, {done, Result}}, Result as
%%     job_add's and job_get's (couch_workers_tx; the NIF crate's jobs/in_tx.rs lists Request and Answer)
%% job_tx_answer(Call, Seq, Answer)           -> true | false (no read Seq waits) | dirty
%% job_tx_add_dirty/6, job_tx_update_dirty/4, job_tx_finish_dirty/4, job_tx_resubmit_dirty/7,
%% job_tx_answer_dirty/3                      the DirtyCpu twins: as above, never `dirty'
%% job_tx_close(Call)                         -> ok; the reads still waiting and later ones fail
%% test_tx_call()                             -> Call, closed (job_tx_answer/3 answers false)
%% budgeted(Nif, Args)                        Nif's answer, through its twin when it is `dirty'
%%
%% Leadership (couch_workers_leader):
%% leader(Ref, WorkerType)                    -> ok | {error, _}  then {Ref, {ok, Id, Epoch} | {error, not_found | Name}}
%% job_add_if_leader(Ref, Type, Id, Info, Opts, {WorkerType, Epoch})
%%                                            as job_add/5, written only while Epoch leads WorkerType
%%                                            (checked in the same transaction), else {Ref, {error, not_leader}}
%% job_resubmit_if_leader(Ref, Type, Id, Info, Opts, VS | undefined, {WorkerType, Epoch})
%%                                            as job_resubmit/6, fenced alike
%% job_add_if_leader_dirty/6, job_resubmit_if_leader_dirty/7: their DirtyCpu twins
%%
%% Recurring jobs (couch_workers_schedules):
%% schedule_set(Ref, Type, Id, Spec, Info, Opts, {WorkerType, Epoch} | undefined)
%%                                            -> ok | {error, _} | dirty  then {Ref, ok | {error, {bad_schedule, Why} | not_leader | Name}}
%% schedule_set_dirty/7: its DirtyCpu twin
%% schedule_remove(Ref, Type, Id)             -> ok | {error, _}  then {Ref, ok | {error, not_found | Name}}
%% schedules(Ref, Type)                       -> ok | {error, _}  then {Ref, {ok, [#{id, spec, info, opts := {Priority, MaxAttempts, Keep},
%%                                                                  next_run_at, last_run}]} | {error, Name}}
%% schedule_types(Ref)                        -> ok | {error, _}  then {Ref, {ok, [Type]} | {error, Name}}
%% worker_notify(Registration, Owner, Tag) also sends the registration's leadership to Owner:
%%     {couch_workers_leader, Tag, Epoch} when it becomes its type's leader (at once if it leads),
%%     {couch_workers_leader_lost, Tag, Epoch} when it stops
%% '''
%%
%% This list is the one description of the NIF protocol; argument shapes
%% and the accept and subscription state machines are in the NIF crate's
%% `jobs/' (`args.rs', `accept.rs', `subscribe.rs').
%%
%% The library is loaded once, from `priv/libcouch_workers_nif.so' of the app. It
%% has no upgrade callback, so loading this module again fails instead of
%% loading a second copy of the library (its runtime and node are global
%% to the VM).
-module(couch_workers_nif).

-on_load(init/0).

-export([
    start/2,
    stop/1,
    stats/0,
    set_log_pid/1,
    test_panic/1,
    test_thread_wait_ns/0,
    worker_register/4,
    worker_unregister/2,
    worker_notify/3,
    worker_remove_dead/2,
    membership_watch/2,
    membership_unwatch/1
]).
%% The job queue (see the "jobs" section below).
-export([
    job_add/5,
    job_add_many/3,
    job_accept/4,
    job_accept_abandon/1,
    job_update/3,
    job_finish/3,
    job_finish_accept/4,
    job_cancel/3,
    job_remove/3,
    job_get/3,
    job_tx_session/1,
    job_tx_add/6,
    job_tx_add_dirty/6,
    job_tx_get/4,
    job_tx_answer/3,
    job_tx_update/4,
    job_tx_update_dirty/4,
    job_tx_finish/4,
    job_tx_finish_dirty/4,
    job_tx_resubmit/7,
    job_tx_resubmit_dirty/7,
    job_tx_remove/5,
    job_tx_cancel/4,
    job_tx_answer_dirty/3,
    job_tx_close/1,
    test_tx_call/0,
    job_pending_count/2,
    job_subscribe/5,
    job_unsubscribe/1,
    job_fail/4,
    job_release/4,
    job_resubmit/6,
    job_remove_if/4,
    job_counts/2,
    job_types/1,
    job_list/5,
    job_set_paused/3
]).

%% Job type settings (see the "job types" section below).
-export([
    job_type_get/2,
    job_type_set/3
]).

%% Operations (see the "ops" section below).
-export([
    ops_worker_types/1,
    ops_workers/2,
    ops_job_paused/2,
    ops_store_counters/0
]).

%% The DirtyCpu twins of the NIFs that convert a caller's map.
-export([
    worker_register_dirty/4,
    job_add_dirty/5,
    job_update_dirty/3,
    job_finish_dirty/3,
    job_finish_accept_dirty/4,
    job_fail_dirty/4,
    job_release_dirty/4,
    job_resubmit_dirty/6
]).

%% Leadership (see the "leadership" section at the end).
-export([
    leader/2,
    job_add_if_leader/6,
    job_resubmit_if_leader/7,
    job_add_if_leader_dirty/6,
    job_resubmit_if_leader_dirty/7
]).

%% Recurring jobs (see the "recurring jobs" section at the end).
-export([
    schedule_set/7,
    schedule_set_dirty/7,
    schedule_remove/3,
    schedules/2,
    schedule_types/1
]).

-export([wait/2, call/1, budgeted/2]).

-include_lib("kernel/include/logger.hrl").


-type registration() :: reference().
-type watch() :: reference().
-type waiter() :: reference().
-type job_subscription() :: reference().
-type budgeted_nif() ::
    worker_register | job_add | job_tx_add | job_tx_update | job_tx_finish | job_tx_resubmit | job_tx_answer
    | job_update | job_finish | job_finish_accept | job_fail | job_release | job_resubmit.
-type job_opts() :: {
    integer() | undefined,
    {delay | run_at, non_neg_integer()} | undefined,
    pos_integer() | infinity | undefined,
    non_neg_integer() | infinity | undefined
} | {
    integer() | undefined,
    {delay | run_at, non_neg_integer()} | undefined,
    pos_integer() | infinity | undefined,
    non_neg_integer() | infinity | undefined,
    binary()
} | {
    integer() | undefined,
    {delay | run_at, non_neg_integer()} | undefined,
    pos_integer() | infinity | undefined,
    non_neg_integer() | infinity | undefined,
    binary() | undefined,
    binary() | undefined,
    pos_integer() | infinity | undefined
}.
-type retry() :: false | {delay, non_neg_integer()} | {backoff, non_neg_integer(), non_neg_integer()}.
-export_type([registration/0, watch/0, waiter/0, job_subscription/0, budgeted_nif/0, job_opts/0, retry/0]).

-spec init() -> ok | {error, term()}.
init() ->
    Path = couch_workers_nif_lib:path(),
    case filelib:is_regular(Path ++ ".so") of
        false ->
            ?LOG_ERROR(#{
                what => nif_library_missing,
                path => Path ++ ".so",
                hint => "build it with `rebar3 compile` or `rebar compile` (their hook runs scripts/build-nif.sh; needs cargo)"
            }),
            {error, {nif_library_missing, Path ++ ".so"}};
        true ->
            case erlang:load_nif(Path, 0) of
                ok ->
                    ok;
                {error, Reason} = Error ->
                    ?LOG_ERROR(#{what => nif_load_failed, path => Path, reason => Reason}),
                    Error
            end
    end.

%% @doc Waits for the `{Ref, Result}' answer of an asynchronous NIF, for
%% `Timeout' ms of time this VM could run.
%%
%% Every request gets exactly one answer, within the store's budget on
%% the Rust side's clock: this wait is the safety net behind that. A VM
%% that could not run (stopped with SIGSTOP, swapped out, starved) stops
%% both clocks' work, but its timers run on; one that fired on the thaw
%% would answer `timeout' for a write whose answer is a moment away, and
%% may say it committed. So the wait is counted in steps, and a step is
%% credited with at most what it could have taken: time the VM could not
%% run is not counted (as the reaper counts no stall of its own).
-spec wait(reference(), timeout()) -> term().
wait(Ref, infinity) ->
    receive
        {Ref, Result} -> Result
    end;
wait(Ref, Timeout) ->
    wait_steps(Ref, Timeout, erlang:monotonic_time(millisecond)).

-define(WAIT_STEP_MS, 250).
%% A step that wakes up this much later than planned was not running.
-define(WAIT_STEP_SLACK_MS, 100).

wait_steps(Ref, Left, Last) ->
    Step = min(Left, ?WAIT_STEP_MS),
    receive
        {Ref, Result} -> Result
    after Step ->
        Now = erlang:monotonic_time(millisecond),
        case Left - min(Now - Last, Step + ?WAIT_STEP_SLACK_MS) of
            Rest when Rest =< 0 -> {error, timeout};
            Rest -> wait_steps(Ref, Rest, Now)
        end
    end.

%% @doc Starts an asynchronous NIF, `Start(Ref)' with a fresh `Ref', and
%% waits for its answer as long as an API call waits for the store
%% (`couch_workers_app:call_timeout/0'). A NIF that refuses at once
%% answers its error.
-spec call(fun((reference()) -> ok | {error, term()})) -> term().
call(Start) ->
    Ref = make_ref(),
    case Start(Ref) of
        ok -> wait(Ref, couch_workers_app:call_timeout());
        {error, _} = Error -> Error
    end.

%% @doc Calls `Nif' with `Args' on the calling scheduler; when that
%% answers `dirty' (the map in `Args' has too many terms to convert
%% there), calls its DirtyCpu twin `Nif_dirty' with the same arguments.
%% Either way the answer is the NIF's: `ok', `{error, _}' or a `badarg'
%% error.
-spec budgeted(budgeted_nif(), [term()]) -> ok | {ok, waiter()} | {error, atom()} | boolean().
budgeted(Nif, Args) ->
    case erlang:apply(?MODULE, Nif, Args) of
        dirty -> erlang:apply(?MODULE, dirty_twin(Nif), Args);
        Answer -> Answer
    end.

dirty_twin(worker_register) -> worker_register_dirty;
dirty_twin(job_add) -> job_add_dirty;
dirty_twin(job_tx_add) -> job_tx_add_dirty;
dirty_twin(job_tx_update) -> job_tx_update_dirty;
dirty_twin(job_tx_finish) -> job_tx_finish_dirty;
dirty_twin(job_tx_resubmit) -> job_tx_resubmit_dirty;
dirty_twin(job_tx_answer) -> job_tx_answer_dirty;
dirty_twin(job_update) -> job_update_dirty;
dirty_twin(job_finish) -> job_finish_dirty;
dirty_twin(job_finish_accept) -> job_finish_accept_dirty;
dirty_twin(job_fail) -> job_fail_dirty;
dirty_twin(job_release) -> job_release_dirty;
dirty_twin(job_resubmit) -> job_resubmit_dirty.

%% ---- lifecycle -----------------------------------------------------------

-spec start(reference(), map()) -> ok | {error, term()}.
start(_Ref, _Config) -> erlang:nif_error(nif_not_loaded).

-spec stop(reference()) -> ok | {error, atom()}.
stop(_Ref) -> erlang:nif_error(nif_not_loaded).

-spec stats() -> #{atom() => term()}.
stats() -> erlang:nif_error(nif_not_loaded).

-spec set_log_pid(pid() | undefined) -> ok.
set_log_pid(_Pid) -> erlang:nif_error(nif_not_loaded).

-spec test_panic(reference()) -> ok | {error, atom()}.
test_panic(_Ref) -> erlang:nif_error(nif_not_loaded).

-spec test_thread_wait_ns() -> non_neg_integer() | undefined.
test_thread_wait_ns() -> erlang:nif_error(nif_not_loaded).

%% ---- workers -------------------------------------------------------------

-spec worker_register(reference(), binary(), binary(), map()) -> ok | {error, atom()} | dirty.
worker_register(_Ref, _Type, _Id, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec worker_register_dirty(reference(), binary(), binary(), map()) -> ok | {error, atom()}.
worker_register_dirty(_Ref, _Type, _Id, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec worker_unregister(reference(), registration()) -> ok | {error, atom()}.
worker_unregister(_Ref, _Registration) -> erlang:nif_error(nif_not_loaded).

-spec worker_notify(registration(), pid(), reference()) -> ok.
worker_notify(_Registration, _Owner, _Tag) -> erlang:nif_error(nif_not_loaded).
-spec worker_remove_dead(reference(), registration()) -> ok | {error, atom()}.
worker_remove_dead(_Ref, _Registration) -> erlang:nif_error(nif_not_loaded).

%% ---- membership ----------------------------------------------------------

-spec membership_watch(binary(), atom() | reference()) -> {ok, watch()} | {error, atom()}.
membership_watch(_Type, _Tag) -> erlang:nif_error(nif_not_loaded).

-spec membership_unwatch(watch()) -> ok.
membership_unwatch(_Watch) -> erlang:nif_error(nif_not_loaded).

%% ---- jobs ----------------------------------------------------------------

-spec job_add(reference(), binary(), binary(), map(), job_opts()) -> ok | {error, atom()} | dirty.
job_add(_Ref, _Type, _Id, _Info, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec job_add_dirty(reference(), binary(), binary(), map(), job_opts()) -> ok | {error, atom()}.
job_add_dirty(_Ref, _Type, _Id, _Info, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec job_add_many(reference(), binary(), [{binary(), map(), job_opts()}]) -> ok | {error, atom()}.
job_add_many(_Ref, _Type, _Jobs) -> erlang:nif_error(nif_not_loaded).

-spec job_accept(reference(), binary(), binary() | registration(), non_neg_integer()) -> {ok, waiter()} | {error, atom()}.
job_accept(_Ref, _Type, _Worker, _TimeoutMs) -> erlang:nif_error(nif_not_loaded).

-spec job_accept_abandon(waiter()) -> abandoned | delivered.
job_accept_abandon(_Waiter) -> erlang:nif_error(nif_not_loaded).

-spec job_update(reference(), map(), map()) -> ok | {error, atom()} | dirty.
job_update(_Ref, _Handle, _Info) -> erlang:nif_error(nif_not_loaded).

-spec job_update_dirty(reference(), map(), map()) -> ok | {error, atom()}.
job_update_dirty(_Ref, _Handle, _Info) -> erlang:nif_error(nif_not_loaded).

-spec job_finish(reference(), map(), map()) -> ok | {error, atom()} | dirty.
job_finish(_Ref, _Handle, _Result) -> erlang:nif_error(nif_not_loaded).

-spec job_finish_dirty(reference(), map(), map()) -> ok | {error, atom()}.
job_finish_dirty(_Ref, _Handle, _Result) -> erlang:nif_error(nif_not_loaded).

-spec job_finish_accept(reference(), map(), map(), registration()) -> {ok, waiter()} | {error, atom()} | dirty.
job_finish_accept(_Ref, _Handle, _Result, _Registration) -> erlang:nif_error(nif_not_loaded).

-spec job_finish_accept_dirty(reference(), map(), map(), registration()) -> {ok, waiter()} | {error, atom()}.
job_finish_accept_dirty(_Ref, _Handle, _Result, _Registration) -> erlang:nif_error(nif_not_loaded).

-spec job_cancel(reference(), binary(), binary()) -> ok | {error, atom()}.
job_cancel(_Ref, _Type, _Id) -> erlang:nif_error(nif_not_loaded).

-spec job_remove(reference(), binary(), binary()) -> ok | {error, atom()}.
job_remove(_Ref, _Type, _Id) -> erlang:nif_error(nif_not_loaded).

-spec job_get(reference(), binary(), binary()) -> ok | {error, atom()}.
job_get(_Ref, _Type, _Id) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_session(non_neg_integer()) -> reference().
job_tx_session(_ReadVersion) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_add(reference(), reference(), binary(), binary(), map(), job_opts()) ->
    {ok, reference()} | {error, atom()} | dirty.
job_tx_add(_Ref, _Session, _Type, _Id, _Info, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_add_dirty(reference(), reference(), binary(), binary(), map(), job_opts()) ->
    {ok, reference()} | {error, atom()}.
job_tx_add_dirty(_Ref, _Session, _Type, _Id, _Info, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_get(reference(), reference(), binary(), binary()) -> {ok, reference()} | {error, atom()}.
job_tx_get(_Ref, _Session, _Type, _Id) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_answer(reference(), non_neg_integer(), term()) -> boolean() | dirty.
job_tx_answer(_Call, _Seq, _Answer) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_answer_dirty(reference(), non_neg_integer(), term()) -> boolean().
job_tx_answer_dirty(_Call, _Seq, _Answer) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_update(reference(), reference(), map(), map()) -> {ok, reference()} | {error, atom()} | dirty.
job_tx_update(_Ref, _Session, _Handle, _Info) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_update_dirty(reference(), reference(), map(), map()) -> {ok, reference()} | {error, atom()}.
job_tx_update_dirty(_Ref, _Session, _Handle, _Info) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_finish(reference(), reference(), map(), map()) -> {ok, reference()} | {error, atom()} | dirty.
job_tx_finish(_Ref, _Session, _Handle, _Result) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_finish_dirty(reference(), reference(), map(), map()) -> {ok, reference()} | {error, atom()}.
job_tx_finish_dirty(_Ref, _Session, _Handle, _Result) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_resubmit(reference(), reference(), binary(), binary(), map(), job_opts(), binary() | undefined) ->
    {ok, reference()} | {error, atom()} | dirty.
job_tx_resubmit(_Ref, _Session, _Type, _Id, _Info, _Opts, _IfVs) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_resubmit_dirty(reference(), reference(), binary(), binary(), map(), job_opts(), binary() | undefined) ->
    {ok, reference()} | {error, atom()}.
job_tx_resubmit_dirty(_Ref, _Session, _Type, _Id, _Info, _Opts, _IfVs) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_remove(reference(), reference(), binary(), binary(), binary() | undefined) ->
    {ok, reference()} | {error, atom()}.
job_tx_remove(_Ref, _Session, _Type, _Id, _IfVs) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_cancel(reference(), reference(), binary(), binary()) -> {ok, reference()} | {error, atom()}.
job_tx_cancel(_Ref, _Session, _Type, _Id) -> erlang:nif_error(nif_not_loaded).

-spec job_tx_close(reference()) -> ok.
job_tx_close(_Call) -> erlang:nif_error(nif_not_loaded).

-spec test_tx_call() -> reference().
test_tx_call() -> erlang:nif_error(nif_not_loaded).

-spec job_pending_count(reference(), binary()) -> ok | {error, atom()}.
job_pending_count(_Ref, _Type) -> erlang:nif_error(nif_not_loaded).

-spec job_subscribe(reference(), binary(), binary(), pid(), reference()) -> ok | {error, atom()}.
job_subscribe(_Ref, _Type, _Id, _Pid, _SubRef) -> erlang:nif_error(nif_not_loaded).

-spec job_unsubscribe(job_subscription()) -> ok.
job_unsubscribe(_Sub) -> erlang:nif_error(nif_not_loaded).

-spec job_fail(reference(), map(), map(), retry()) -> ok | {error, atom()} | dirty.
job_fail(_Ref, _Handle, _Error, _Retry) -> erlang:nif_error(nif_not_loaded).

-spec job_fail_dirty(reference(), map(), map(), retry()) -> ok | {error, atom()}.
job_fail_dirty(_Ref, _Handle, _Error, _Retry) -> erlang:nif_error(nif_not_loaded).

-spec job_release(reference(), map(), map() | undefined, job_opts()) -> ok | {error, atom()} | dirty.
job_release(_Ref, _Handle, _Info, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec job_release_dirty(reference(), map(), map() | undefined, job_opts()) -> ok | {error, atom()}.
job_release_dirty(_Ref, _Handle, _Info, _Opts) -> erlang:nif_error(nif_not_loaded).

-spec job_resubmit(reference(), binary(), binary(), map(), job_opts(), binary() | undefined) ->
    ok | {error, atom()} | dirty.
job_resubmit(_Ref, _Type, _Id, _Info, _Opts, _IfVs) -> erlang:nif_error(nif_not_loaded).

-spec job_resubmit_dirty(reference(), binary(), binary(), map(), job_opts(), binary() | undefined) ->
    ok | {error, atom()}.
job_resubmit_dirty(_Ref, _Type, _Id, _Info, _Opts, _IfVs) -> erlang:nif_error(nif_not_loaded).

-spec job_remove_if(reference(), binary(), binary(), binary() | undefined) -> ok | {error, atom()}.
job_remove_if(_Ref, _Type, _Id, _IfVs) -> erlang:nif_error(nif_not_loaded).

-spec job_counts(reference(), binary()) -> ok | {error, atom()}.
job_counts(_Ref, _Type) -> erlang:nif_error(nif_not_loaded).

-spec job_types(reference()) -> ok | {error, atom()}.
job_types(_Ref) -> erlang:nif_error(nif_not_loaded).

-spec job_list(reference(), binary(), all | [atom()], pos_integer(), binary() | undefined) -> ok | {error, atom()}.
job_list(_Ref, _Type, _States, _Limit, _After) -> erlang:nif_error(nif_not_loaded).

-spec job_set_paused(reference(), binary(), boolean()) -> ok | {error, atom()}.
job_set_paused(_Ref, _Type, _Paused) -> erlang:nif_error(nif_not_loaded).

%% ---- job types -----------------------------------------------------------

%% job_type_get(Ref, Type)            -> ok | {error, _}  then {Ref, {ok, Settings} | {error, Name}}
%% job_type_set(Ref, Type, Settings)  -> ok | {error, _}  then {Ref, {ok, Settings} | {error, Name}}
%%     (`Settings' a map of `activity_timeout', `max_running',
%%     `max_running_per_group' to a non-negative integer or `infinity';
%%     other shapes badarg; the answer: every setting as stored)

-spec job_type_get(reference(), binary()) -> ok | {error, atom()}.
job_type_get(_Ref, _Type) -> erlang:nif_error(nif_not_loaded).

-spec job_type_set(reference(), binary(), map()) -> ok | {error, atom()}.
job_type_set(_Ref, _Type, _Settings) -> erlang:nif_error(nif_not_loaded).

%% ---- ops -----------------------------------------------------------------

-spec ops_worker_types(reference()) -> ok | {error, atom()}.
ops_worker_types(_Ref) -> erlang:nif_error(nif_not_loaded).

-spec ops_workers(reference(), binary()) -> ok | {error, atom()}.
ops_workers(_Ref, _Type) -> erlang:nif_error(nif_not_loaded).

-spec ops_job_paused(reference(), binary()) -> ok | {error, atom()}.
ops_job_paused(_Ref, _Type) -> erlang:nif_error(nif_not_loaded).

-spec ops_store_counters() -> #{atom() => non_neg_integer()}.
ops_store_counters() -> erlang:nif_error(nif_not_loaded).

%% ---- leadership --------------------------------------------------------------

-spec leader(reference(), binary()) -> ok | {error, atom()}.
leader(_Ref, _WorkerType) -> erlang:nif_error(nif_not_loaded).

-spec job_add_if_leader(reference(), binary(), binary(), map(), job_opts(), {binary(), binary()}) ->
    ok | {error, atom()} | dirty.
job_add_if_leader(_Ref, _Type, _Id, _Info, _Opts, _Fence) -> erlang:nif_error(nif_not_loaded).

-spec job_add_if_leader_dirty(reference(), binary(), binary(), map(), job_opts(), {binary(), binary()}) ->
    ok | {error, atom()}.
job_add_if_leader_dirty(_Ref, _Type, _Id, _Info, _Opts, _Fence) -> erlang:nif_error(nif_not_loaded).

-spec job_resubmit_if_leader(
    reference(), binary(), binary(), map(), job_opts(), binary() | undefined, {binary(), binary()}
) -> ok | {error, atom()} | dirty.
job_resubmit_if_leader(_Ref, _Type, _Id, _Info, _Opts, _VS, _Fence) -> erlang:nif_error(nif_not_loaded).

-spec job_resubmit_if_leader_dirty(
    reference(), binary(), binary(), map(), job_opts(), binary() | undefined, {binary(), binary()}
) -> ok | {error, atom()}.
job_resubmit_if_leader_dirty(_Ref, _Type, _Id, _Info, _Opts, _VS, _Fence) -> erlang:nif_error(nif_not_loaded).

%% ---- recurring jobs ------------------------------------------------------------

-spec schedule_set(reference(), binary(), binary(), map(), map(), job_opts(), {binary(), binary()} | undefined) ->
    ok | {error, term()} | dirty.
schedule_set(_Ref, _Type, _Id, _Spec, _Info, _Opts, _Fence) -> erlang:nif_error(nif_not_loaded).

-spec schedule_set_dirty(reference(), binary(), binary(), map(), map(), job_opts(), {binary(), binary()} | undefined) ->
    ok | {error, term()}.
schedule_set_dirty(_Ref, _Type, _Id, _Spec, _Info, _Opts, _Fence) -> erlang:nif_error(nif_not_loaded).

-spec schedule_remove(reference(), binary(), binary()) -> ok | {error, atom()}.
schedule_remove(_Ref, _Type, _Id) -> erlang:nif_error(nif_not_loaded).

-spec schedules(reference(), binary()) -> ok | {error, atom()}.
schedules(_Ref, _Type) -> erlang:nif_error(nif_not_loaded).

-spec schedule_types(reference()) -> ok | {error, atom()}.
schedule_types(_Ref) -> erlang:nif_error(nif_not_loaded).
