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
%% requeued by failover and pruned happen inside the core's job code and
%% need a hook there (not counted yet); so do `job_fail/3' and
%% `job_release/2', which do not exist yet.
-module(couch_workers_observe).

-export([call/4, worker/3, log_event/2]).

-type action() :: job_added | job_added_many | job_accepted | job_finished | job_canceled | job_removed.
-export_type([action/0]).

%% @doc Runs `Fun' (an API call of `Action'), and when it succeeded,
%% records the event with its duration. `Subject' is the job id, or what
%% `Action' needs to name its jobs (the list of `job_add_many/2', the
%% handle of `job_finish/2'); `job_accepted' reads the job from the
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
done(job_accepted, _Type, _Subject, {ok, #{type := Type, id := Id}}, D) ->
    job(accepted, Type, Id, D, jobs_accepted, accept_wait);
done(job_finished, _Type, #{type := Type, id := Id}, ok, D) ->
    job(finished, Type, Id, D, jobs_finished, finish);
done(job_canceled, Type, Id, ok, D) ->
    job(canceled, Type, Id, D, jobs_canceled, none);
done(job_removed, Type, Id, ok, D) ->
    job(removed, Type, Id, D, jobs_removed, none);
done(_Action, _Type, _Subject, _Failed, _D) ->
    ok.

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
%% failed heartbeats (of this node's workers) are counted; the rest are
%% only logged.
-spec log_event(atom(), map()) -> ok.
log_event(worker_reaped, #{type := Type, id := Id}) ->
    couch_workers_metrics:count(workers_reaped, Type),
    couch_workers_telemetry:execute(
        [couch_workers, worker, reaped], #{system_time => erlang:system_time(), count => 1}, #{type => Type, id => Id}
    );
log_event(heartbeat_failed, #{type := Type, id := Id} = Fields) ->
    couch_workers_metrics:count(heartbeat_failures, Type),
    couch_workers_telemetry:execute(
        [couch_workers, heartbeat, failed],
        #{system_time => erlang:system_time(), count => 1, failures => maps:get(failures, Fields, 1)},
        #{type => Type, id => Id, reason => maps:get(reason, Fields, null)}
    );
log_event(_What, _Fields) ->
    ok.

us(Native) ->
    erlang:convert_time_unit(Native, native, microsecond).
