%% @doc Where each counted event is recorded: counted in this node's
%% metrics (`couch_workers_metrics') and emitted to `telemetry' handlers
%% (`couch_workers_telemetry'), one definition of the event for both.
%%
%% Events come from three places. The API boundary (`couch_workers')
%% wraps job calls in `call/4', which times the call and records it when
%% it succeeded. `couch_workers_local' records a worker's registration
%% and removal when the store has written it (`worker/3'). The Rust
%% side's log events for reaps and failed heartbeats, forwarded by
%% `couch_workers_events', are recorded by `log_event/2'.
%%
%% Counting at the API boundary counts what this node's callers did. Jobs
%% failed over and pruned happen inside the core's job code, on whichever
%% node's reaper, sweeper or pruner did it: the core says how many in its
%% log events (`worker_reaped' carries `jobs', the running jobs the reap
%% failed over; `worker_jobs_requeued' the running jobs of a registration
%% of this node that failed over because its owner exited or a new
%% registration of its id replaced it; `orphaned_jobs_requeued' and
%% `jobs_pruned' carry `type' and `count'), and `log_event/2' counts them.
%%
%% Job calls made inside a caller's transaction (`couch_workers_tx') are
%% counted when that transaction commits, once: the store counts them
%% (`jobs/tx_counts.rs' of the core), and this node's watcher of its
%% counts reports what grew as `tx_calls_counted' events (`type', `event',
%% `count'), which `log_event/2' records, their telemetry event with
%% `count' the number of calls and metadata `in_caller_tx => true' (no
%% `duration', no `id': the call's latency and job are the caller's
%% transaction's, not known when its commit is seen).
%%
%% `job_fail/3' answers `ok' whether the job was retried or ended failed;
%% which of the two is read from the handle and the options by the rule
%% the core applies (`retry => false', or `attempts' reached
%% `max_attempts': failed; else retried). A job whose cancel was requested
%% during the run ends canceled instead, and one resubmitted during it is
%% queued again: both count by that rule all the same.
-module(couch_workers_observe).

-export([call/4, worker/3, log_event/2]).

-type action() ::
    job_added
    | job_added_many
    | job_accepted
    | job_finished
    | job_finish_accepted
    | job_failed
    | job_released
    | job_resubmitted
    | job_canceled
    | job_removed.
-export_type([action/0]).

%% @doc Runs `Fun' (an API call of `Action'), and when it succeeded,
%% records the event with its duration. `Subject' is the job id, or what
%% `Action' needs to name its jobs (the list of `job_add_many/2', the
%% handle of `job_finish/2' and `job_release/2', `{Handle, Error, Opts}'
%% of `job_fail/3'); `job_accepted' reads the job from the
%% answer. Returns what `Fun' returned; an exception of `Fun' passes
%% through, recording nothing.
-spec call(action(), term(), term(), fun(() -> Result)) -> Result.
call(Action, Type, Subject, Fun) ->
    T0 = erlang:monotonic_time(),
    Result = Fun(),
    done(Action, Type, Subject, Result, erlang:monotonic_time() - T0),
    Result.

done(job_added, Type, Id, ok, D) ->
    job(added, Type, Id, D, jobs_added, add);
done(job_added_many, Type, Jobs, ok, D) ->
    Ids = [Id || {Id, _Info, _Opts} <- Jobs],
    N = length(Ids),
    couch_workers_metrics:count(jobs_added, Type, N),
    couch_workers_metrics:observe(add, Type, us(D)),
    couch_workers_telemetry:execute([couch_workers, job, added], #{duration => D, count => N}, #{type => Type, ids => Ids});
done(job_accepted, _Type, _Subject, {ok, #{type := Type, id := Id} = Job}, D) ->
    couch_workers_metrics:record(jobs_accepted, accept_wait, Type, us(D)),
    couch_workers_telemetry:execute(
        [couch_workers, job, accepted], queue_time(Job, #{duration => D, count => 1}), #{type => Type, id => Id}
    );
done(job_finished, _Type, #{type := Type, id := Id}, ok, D) ->
    job(finished, Type, Id, D, jobs_finished, finish);
done(job_failed, _Type, {#{type := Type, id := Id} = Job, Error, Opts}, ok, D) ->
    {Action, Counter} =
        case retried(Job, Opts) of
            true -> {retried, jobs_retried};
            false -> {failed, jobs_failed}
        end,
    couch_workers_metrics:record(Counter, fail, Type, us(D)),
    couch_workers_telemetry:execute(
        [couch_workers, job, Action],
        #{duration => D, count => 1},
        #{type => Type, id => Id, attempts => maps:get(attempts, Job, null), error => Error}
    );
done(job_released, _Type, #{type := Type, id := Id}, ok, D) ->
    job(released, Type, Id, D, jobs_released, release);
done(job_resubmitted, Type, Id, ok, D) ->
    job(resubmitted, Type, Id, D, jobs_resubmitted, resubmit);
done(job_canceled, Type, Id, ok, D) ->
    job(canceled, Type, Id, D, jobs_canceled, none);
done(job_removed, Type, Id, ok, D) ->
    job(removed, Type, Id, D, jobs_removed, none);
done(job_finish_accepted, Type, Job, {ok, Next}, D) ->
    %% A finish, and an accept when it took a job: each as its own call.
    done(job_finished, Type, Job, ok, D),
    done(job_accepted, Type, none, {ok, Next}, D);
done(_Action, _Type, _Subject, _Failed, _D) ->
    ok.

%% Whether `job_fail(Job, _, Opts)' retries the job: the core's rule, on
%% the handle's `attempts' (accepts so far, this one included) and
%% `max_attempts', which no call changes while the job runs.
retried(Job, Opts) ->
    Retry =
        case Opts of
            #{retry := R} -> R;
            #{<<"retry">> := R} -> R;
            #{} -> true
        end,
    case {Retry, maps:get(attempts, Job, undefined), maps:get(max_attempts, Job, undefined)} of
        {false, _, _} -> false;
        {_, A, infinity} when is_integer(A) -> true;
        {_, A, M} when is_integer(A), is_integer(M) -> A < M;
        {_, _, _} -> false
    end.

job(Action, Type, Id, D, Counter, Histogram) ->
    case Histogram of
        none -> couch_workers_metrics:count(Counter, Type);
        _ -> couch_workers_metrics:record(Counter, Histogram, Type, us(D))
    end,
    couch_workers_telemetry:execute([couch_workers, job, Action], #{duration => D, count => 1}, #{type => Type, id => Id}).

%% @doc A worker of this node was registered, or removed (unregistered,
%% or its owner exited), as the store has written it.
-spec worker(registered | unregistered, binary(), binary()) -> ok.
worker(Action, Type, Id) ->
    Counter =
        case Action of
            registered -> workers_registered;
            unregistered -> workers_unregistered
        end,
    couch_workers_metrics:count(Counter, Type),
    couch_workers_telemetry:execute(
        [couch_workers, worker, Action], #{system_time => erlang:system_time(), count => 1}, #{type => Type, id => Id}
    ).

%% @doc A log event of the Rust side: reaps (by this node's reaper) and
%% the running jobs they failed over, leftovers of removed workers that
%% this node's sweeper requeued, prunes by this node's pruner, and failed
%% heartbeats (of this node's workers) are counted; running jobs of this
%% node's workers taken back for their activity timeout (`job_timed_out')
%% are counted and emitted to telemetry, `[couch_workers, job,
%% timed_out]'; the rest
%% are only logged.
-spec log_event(atom(), map()) -> ok.
log_event(worker_reaped, #{type := Type, id := Id} = Fields) ->
    couch_workers_metrics:count(workers_reaped, Type),
    couch_workers_telemetry:execute(
        [couch_workers, worker, reaped], #{system_time => erlang:system_time(), count => 1}, #{type => Type, id => Id}
    ),
    requeued(Type, Id, maps:get(jobs, Fields, 0), reaped);
log_event(orphaned_jobs_requeued, #{type := Type, worker := Worker, count := N}) ->
    requeued(Type, Worker, N, swept);
log_event(worker_jobs_requeued, #{type := Type, id := Id, jobs := N, reason := Reason}) ->
    requeued(Type, Id, N, requeue_reason(Reason));
log_event(jobs_pruned, #{type := Type, count := N}) when is_integer(N), N > 0 ->
    couch_workers_metrics:count(jobs_pruned, Type, N),
    couch_workers_telemetry:execute(
        [couch_workers, job, pruned], #{system_time => erlang:system_time(), count => N}, #{type => Type}
    );
log_event(heartbeat_failed, #{type := Type, id := Id} = Fields) ->
    couch_workers_metrics:count(heartbeat_failures, Type),
    couch_workers_telemetry:execute(
        [couch_workers, heartbeat, failed],
        #{system_time => erlang:system_time(), count => 1, failures => maps:get(failures, Fields, 1)},
        #{type => Type, id => Id, reason => maps:get(reason, Fields, null)}
    );
log_event(job_timed_out, #{type := Type, id := Id} = Fields) ->
    couch_workers_metrics:count(jobs_timed_out, Type),
    couch_workers_telemetry:execute(
        [couch_workers, job, timed_out],
        #{system_time => erlang:system_time(), count => 1},
        #{type => Type, id => Id, worker => maps:get(worker, Fields, null), timeout => maps:get(timeout_s, Fields, null)}
    );
log_event(tx_calls_counted, #{type := Type, event := Event, count := N}) when is_integer(N), N > 0 ->
    case tx_event(Event) of
        {Counter, Action} ->
            couch_workers_metrics:count(Counter, Type, N),
            couch_workers_telemetry:execute(
                [couch_workers, job, Action],
                #{system_time => erlang:system_time(), count => N},
                #{type => Type, in_caller_tx => true}
            );
        unknown ->
            ok
    end;
log_event(_What, _Fields) ->
    ok.

%% The counter and telemetry action of an event counted in callers'
%% transactions (the core's `TxEvent' names).
tx_event(<<"added">>) -> {jobs_added, added};
tx_event(<<"resubmitted">>) -> {jobs_resubmitted, resubmitted};
tx_event(<<"finished">>) -> {jobs_finished, finished};
tx_event(<<"canceled">>) -> {jobs_canceled, canceled};
tx_event(<<"removed">>) -> {jobs_removed, removed};
tx_event(_) -> unknown.

%% `N' running jobs of worker `Worker' failed over (workers of type T run
%% jobs of type T): by a reap, by the sweeper after a removal that left
%% more than one transaction's share, on its owner's exit, or by a new
%% registration of its id.
requeued(Type, Worker, N, How) when is_integer(N), N > 0 ->
    couch_workers_metrics:count(jobs_requeued, Type, N),
    couch_workers_telemetry:execute(
        [couch_workers, job, requeued],
        #{system_time => erlang:system_time(), count => N},
        #{type => Type, worker => Worker, reason => How}
    );
requeued(_Type, _Worker, _N, _How) ->
    ok.

requeue_reason(<<"owner_exit">>) -> owner_exit;
requeue_reason(<<"replaced">>) -> replaced;
requeue_reason(Other) -> Other.

%% `queue_time' (native units, as `duration'): how long the job could
%% have been accepted before this accept took it, from the handle's
%% `queued_at' (Unix ms on the clock of the node that queued it; this
%% node's clock reads the end, so clock skew between nodes shows in it; a
%% negative difference is 0). Absent when the handle has no `queued_at'
%% (a job queued by a node that kept no such time).
queue_time(#{queued_at := At}, Measurements) when is_integer(At) ->
    Ms = max(0, erlang:system_time(millisecond) - At),
    Measurements#{queue_time => erlang:convert_time_unit(Ms, millisecond, native)};
queue_time(_Job, Measurements) ->
    Measurements.

us(Native) ->
    erlang:convert_time_unit(Native, native, microsecond).
