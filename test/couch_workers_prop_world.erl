%% @doc The checks after every call of the PropEr test
%% (couch_workers_prop_tests) that the whole world is the model's: every
%% job, the counts, the owners of running jobs, the membership, the app's
%% servers. A failed check throws {check_failed, What}.
-module(couch_workers_prop_world).

-export([check_world/1, flush_membership/0]).

-include("couch_workers_prop.hrl").

-import(couch_workers_prop_cmds, [tbin/1, info/1, opts_json/1]).

check_world(M) ->
    Actual = [{T, J, couch_workers:job_get(tbin(T), J)} || T <- ?TYPES, J <- ?JOB_IDS],
    [check_job(maps:find({T, J}, M#m.jobs), T, J, Got) || {T, J, Got} <- Actual],
    [
        check(
            {pending_count, T},
            length([x || {{T1, _}, #job{state = pending}} <- maps:to_list(M#m.jobs), T1 =:= T]),
            couch_workers:job_pending_count(tbin(T))
        )
     || T <- ?TYPES
    ],
    [
        check(
            {job_counts, T},
            lists:foldl(
                fun(#job{state = S}, Acc) -> maps:update_with(S, fun(N) -> N + 1 end, Acc) end,
                #{scheduled => 0, pending => 0, running => 0, finished => 0, canceled => 0, failed => 0},
                [Job || {{T1, _}, Job} <- maps:to_list(M#m.jobs), T1 =:= T]
            ),
            couch_workers:job_counts(tbin(T))
        )
     || T <- ?TYPES
    ],
    %% No running job without a live registered owner.
    [check_owner(T, J, W) || {T, J, {ok, #{state := running, worker := W}}} <- Actual],
    check_membership(M),
    check_app().

check_job(error, T, J, Got) ->
    check({job, T, J}, {error, not_found}, Got);
check_job({ok, #job{} = Job}, T, J, Got) ->
    Want = #{
        type => tbin(T),
        id => J,
        state => Job#job.state,
        worker => Job#job.worker,
        priority => Job#job.prio,
        info => info(Job#job.info),
        result =>
            case Job#job.result of
                null -> null;
                R -> info(R)
            end,
        attempts => Job#job.attempts,
        cancel_requested => Job#job.cancel_req,
        max_attempts => Job#job.max,
        error =>
            case Job#job.error of
                null -> null;
                worker_lost -> #{<<"reason">> => <<"worker_lost">>};
                E -> info(E)
            end
    },
    case Got of
        {ok, #{} = Map} -> check({job, T, J}, Want, maps:with(maps:keys(Want), Map));
        _ -> check({job, T, J}, {ok, Want}, Got)
    end.

check_owner(T, J, W) ->
    case ets:lookup(couch_workers_local, {tbin(T), W}) of
        [{_, Ref}] ->
            case ets:lookup(couch_workers_local, Ref) of
                [{Ref, _, W, Pid, _, _}] ->
                    check({owner_alive, T, J, W}, true, is_process_alive(Pid));
                Other ->
                    throw({check_failed, {running_without_registration, T, J, W, Other}})
            end;
        [] ->
            throw({check_failed, {running_without_owner, T, J, W}})
    end.

check_membership(M) ->
    [
        case maps:is_key(T, M#m.subs) of
            false ->
                check({get_workers, T}, {error, not_found}, couch_workers:get_workers(tbin(T)));
            true ->
                Want = maps:from_list([{W, opts_json(O)} || {{T1, W}, {_, O}} <- maps:to_list(M#m.workers), T1 =:= T]),
                settle_membership(T, Want, erlang:monotonic_time(millisecond) + 5000)
        end
     || T <- ?TYPES
    ],
    flush_membership().

settle_membership(T, Want, Deadline) ->
    case couch_workers:get_workers(tbin(T)) of
        {ok, _VS, Want} ->
            ok;
        Got ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true ->
                    throw({check_failed, {membership, T, {want, Want}, {got, Got}}});
                false ->
                    %% The next delivery (to this process's subscription)
                    %% or a short nap, then read again.
                    receive
                        {couch_workers_membership, _, _, _, _} -> ok
                    after 2 -> ok
                    end,
                    settle_membership(T, Want, Deadline)
            end
    end.

flush_membership() ->
    receive
        {couch_workers_membership, _, _, _, _} -> flush_membership()
    after 0 -> ok
    end.

check_app() ->
    check(servers, get(servers), [whereis(S) || S <- ?SERVERS]),
    check(running, true, maps:get(running, couch_workers:stats())).

check(_What, Same, Same) -> ok;
check(What, Want, Got) -> throw({check_failed, {What, {want, Want}, {got, Got}}}).
