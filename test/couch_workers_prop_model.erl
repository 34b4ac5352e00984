%% @doc The model of the PropEr test (couch_workers_prop_tests): how each
%% call changes it (next_state/3), and what each call must answer
%% according to it (expected/3).
-module(couch_workers_prop_model).

-export([next_state/3, expected/3, exitable/2]).

-include("couch_workers_prop.hrl").

-import(couch_workers_prop_cmds, [tbin/1, info/1, other_type/1]).

%% An owner may exit while at most one of its workers runs jobs.
exitable(M, O) ->
    Mine = [K || {K, {O1, _}} <- maps:to_list(M#m.workers), O1 =:= O],
    Busy = [K || K <- Mine, running_of(M, K) =/= []],
    length(Busy) =< 1.

running_of(M, {T, W}) ->
    lists:sort([J || {{T1, J}, #job{state = running, worker = W1}} <- maps:to_list(M#m.jobs), T1 =:= T, W1 =:= W]).

next_state(M, _Res, {call, _, register, [T, W, O, OptsN]}) ->
    case maps:is_key({T, W}, M#m.workers) of
        true -> M;
        false -> M#m{workers = maps:put({T, W}, {O, OptsN}, M#m.workers)}
    end;
next_state(M, _Res, {call, _, unregister, [K]}) ->
    remove_worker(M, K, released);
next_state(M, _Res, {call, _, owner_exit, [O, _]}) ->
    Mine = lists:sort([K || {K, {O1, _}} <- maps:to_list(M#m.workers), O1 =:= O]),
    lists:foldl(fun(K, Acc) -> remove_worker(Acc, K, lost) end, M, Mine);
next_state(M, _Res, {call, _, subscribe, [T]}) ->
    M#m{subs = maps:update_with(T, fun(N) -> N + 1 end, 1, M#m.subs)};
next_state(M, _Res, {call, _, unsubscribe, [T]}) ->
    case maps:get(T, M#m.subs) of
        1 -> M#m{subs = maps:remove(T, M#m.subs)};
        N -> M#m{subs = maps:put(T, N - 1, M#m.subs)}
    end;
next_state(M, _Res, {call, _, add, [T, J, I, P]}) ->
    case maps:is_key({T, J}, M#m.jobs) of
        true ->
            M;
        false ->
            C = M#m.counter,
            Job = #job{prio = P, info = I, seq = {C, 0}},
            M#m{jobs = maps:put({T, J}, Job, M#m.jobs), counter = C + 1}
    end;
next_state(M, _Res, {call, _, add_many, [T, List]}) ->
    case add_many_conflicts(M, T, List) of
        [] when List =:= [] ->
            M;
        [] ->
            C = M#m.counter,
            {Jobs, _} = lists:foldl(
                fun({J, I, P}, {Js, Ix}) -> {maps:put({T, J}, #job{prio = P, info = I, seq = {C, Ix}}, Js), Ix + 1} end,
                {M#m.jobs, 0},
                List
            ),
            M#m{jobs = Jobs, counter = C + 1};
        _ ->
            M
    end;
next_state(M, _Res, {call, _, accept, [{T, W} = K]}) ->
    case maps:is_key(K, M#m.workers) of
        false ->
            M;
        true ->
            case next_job(M, T) of
                none ->
                    M;
                {ok, J} ->
                    N = M#m.accepts + 1,
                    Job = maps:get({T, J}, M#m.jobs),
                    Job1 = Job#job{
                        state = running,
                        worker = W,
                        attempts = Job#job.attempts + 1,
                        cancel_req = false,
                        seq = undefined,
                        acc = N
                    },
                    M#m{
                        jobs = maps:put({T, J}, Job1, M#m.jobs),
                        accepts = N,
                        handles = lists:sublist([{N, {T, J}} | M#m.handles], 12)
                    }
            end
    end;
next_state(M, _Res, {call, _, update, [N, I]}) ->
    case handle_status(M, N) of
        {current, Key, #job{cancel_req = true} = Job} ->
            M#m{
                jobs = maps:put(
                    Key, Job#job{state = canceled, worker = null, cancel_req = false, acc = undefined, resub = undefined}, M#m.jobs
                )
            };
        {current, Key, Job} ->
            M#m{jobs = maps:put(Key, Job#job{info = I}, M#m.jobs)};
        _ ->
            M
    end;
next_state(M, _Res, {call, _, finish, [N, R]}) ->
    case handle_status(M, N) of
        {current, Key, Job} ->
            Done = Job#job{state = finished, worker = null, result = R, cancel_req = false, acc = undefined},
            end_run(M, Key, Done, Job#job.resub);
        _ ->
            M
    end;
next_state(M, _Res, {call, _, fail, [N, E, Retry]}) ->
    case handle_status(M, N) of
        {current, Key, #job{attempts = A, max = Max, cancel_req = Cancel} = Job} ->
            Left = Retry =:= 0 andalso A < Max,
            Ended = Job#job{worker = null, error = E, cancel_req = false, acc = undefined},
            case {Left, Cancel} of
                {true, true} -> end_run(M, Key, Ended#job{state = canceled}, undefined);
                {true, false} -> end_run(M, Key, Ended#job{state = pending}, Job#job.resub);
                {false, _} -> end_run(M, Key, Ended#job{state = failed}, Job#job.resub)
            end;
        _ ->
            M
    end;
next_state(M, _Res, {call, _, release, [N]}) ->
    case handle_status(M, N) of
        {current, Key, #job{cancel_req = true} = Job} ->
            end_run(M, Key, Job#job{state = canceled, worker = null, cancel_req = false, acc = undefined, max = Job#job.max + 1}, undefined);
        {current, Key, Job} ->
            end_run(M, Key, Job#job{state = pending, worker = null, acc = undefined, max = Job#job.max + 1}, Job#job.resub);
        _ ->
            M
    end;
next_state(M, _Res, {call, _, resubmit, [T, J, I, P, Max]}) ->
    C = M#m.counter,
    case maps:find({T, J}, M#m.jobs) of
        error ->
            Job = #job{prio = P, info = I, seq = {C, 0}, max = Max},
            M#m{jobs = maps:put({T, J}, Job, M#m.jobs), counter = C + 1};
        {ok, #job{state = running} = Job} ->
            M#m{jobs = maps:put({T, J}, Job#job{resub = {I, P, Max}}, M#m.jobs)};
        {ok, #job{state = pending} = Job} ->
            Job1 = Job#job{info = I, prio = P, max = Max, seq = {C, 0}},
            M#m{jobs = maps:put({T, J}, Job1, M#m.jobs), counter = C + 1};
        {ok, Job} ->
            Job1 = Job#job{state = pending, info = I, prio = P, max = Max, attempts = 0, error = null, seq = {C, 0}},
            M#m{jobs = maps:put({T, J}, Job1, M#m.jobs), counter = C + 1}
    end;
next_state(M, _Res, {call, _, cancel, [T, J]}) ->
    case maps:find({T, J}, M#m.jobs) of
        {ok, #job{state = pending} = Job} ->
            M#m{jobs = maps:put({T, J}, Job#job{state = canceled, seq = undefined}, M#m.jobs)};
        {ok, #job{state = running} = Job} ->
            M#m{jobs = maps:put({T, J}, Job#job{cancel_req = true, resub = undefined}, M#m.jobs)};
        _ ->
            M
    end;
next_state(M, _Res, {call, _, remove, [T, J]}) ->
    M#m{jobs = maps:remove({T, J}, M#m.jobs)};
next_state(M, _Res, {call, _, bad, _}) ->
    M.

%% A run ends as `Job' says (its state already set); a resubmission made
%% while it ran (`Resub') queues it again instead, with attempts 0 and no
%% error. A job that becomes pending takes the next FIFO position.
end_run(M, Key, Job, undefined) ->
    queue(M, Key, Job#job{resub = undefined});
end_run(M, Key, #job{state = canceled} = Job, _Resub) ->
    queue(M, Key, Job#job{resub = undefined});
end_run(M, Key, Job, {I, P, Max}) ->
    queue(M, Key, Job#job{state = pending, info = I, prio = P, max = Max, attempts = 0, error = null, resub = undefined}).

queue(M, Key, #job{state = pending} = Job) ->
    C = M#m.counter,
    M#m{jobs = maps:put(Key, Job#job{seq = {C, 0}}, M#m.jobs), counter = C + 1};
queue(M, Key, Job) ->
    M#m{jobs = maps:put(Key, Job#job{seq = undefined}, M#m.jobs)}.

%% A worker leaves: its running jobs end in one transaction, in job id
%% order. Unregistered (`released'): each is released, attempts kept,
%% max_attempts + 1. Its owner exited (`lost', a death): each fails with
%% `worker_lost', pending again while attempts < max_attempts, else
%% failed. Either way a requested cancel makes it canceled instead, and a
%% waiting resubmission queues it again.
remove_worker(M, {T, _W} = K, How) ->
    case maps:is_key(K, M#m.workers) of
        false ->
            M;
        true ->
            C = M#m.counter,
            {Jobs, _} = lists:foldl(
                fun(J, {Js, Ix}) ->
                    Job0 = maps:get({T, J}, Js),
                    Job =
                        case How of
                            released -> Job0#job{max = Job0#job.max + 1};
                            lost -> Job0#job{error = worker_lost}
                        end,
                    Job1 =
                        case {Job#job.cancel_req, Job#job.resub} of
                            {true, _} ->
                                Job#job{state = canceled, worker = null, cancel_req = false, acc = undefined, resub = undefined};
                            {false, undefined} when How =:= lost, Job#job.attempts >= Job#job.max ->
                                Job#job{state = failed, worker = null, seq = undefined, acc = undefined};
                            {false, undefined} ->
                                Job#job{state = pending, worker = null, seq = {C, Ix}, acc = undefined};
                            {false, {I, P, Max}} ->
                                Job#job{
                                    state = pending, worker = null, seq = {C, Ix}, acc = undefined, info = I, prio = P,
                                    max = Max, attempts = 0, error = null, resub = undefined
                                }
                        end,
                    {maps:put({T, J}, Job1, Js), Ix + 1}
                end,
                {M#m.jobs, 0},
                running_of(M, K)
            ),
            M#m{workers = maps:remove(K, M#m.workers), jobs = Jobs, counter = C + 1}
    end.

%% The next pending job of type T: lowest priority, then first in.
next_job(M, T) ->
    case lists:sort([{{P, S}, J} || {{T1, J}, #job{state = pending, prio = P, seq = S}} <- maps:to_list(M#m.jobs), T1 =:= T]) of
        [] -> none;
        [{_, J} | _] -> {ok, J}
    end.

%% What a handle of accept N meets: the job it holds (current), a job of
%% that key that it no longer holds (not_owner), or no job (not_found).
handle_status(M, N) ->
    {N, Key} = lists:keyfind(N, 1, M#m.handles),
    case maps:find(Key, M#m.jobs) of
        {ok, #job{state = running, acc = N} = Job} -> {current, Key, Job};
        {ok, _} -> not_owner;
        error -> not_found
    end.

%% Ids of an add_many that exist or repeat, in list order, each once.
add_many_conflicts(M, T, List) ->
    {Out, _, _} = lists:foldl(
        fun({J, _, _}, {Acc, Seen, Reported}) ->
            Repeated = sets:is_element(J, Seen),
            Exists = maps:is_key({T, J}, M#m.jobs),
            case (Exists orelse Repeated) andalso not sets:is_element(J, Reported) of
                true -> {[J | Acc], sets:add_element(J, Seen), sets:add_element(J, Reported)};
                false -> {Acc, sets:add_element(J, Seen), Reported}
            end
        end,
        {[], sets:new(), sets:new()},
        List
    ),
    lists:reverse(Out).

%% ---- the result a call must give -----------------------------------------------

expected(M, {call, _, register, [T, W, _, _]}, Res) ->
    case maps:is_key({T, W}, M#m.workers) of
        true -> Res =:= {registered, same};
        false -> Res =:= {registered, new}
    end;
expected(_M, {call, _, unregister, _}, Res) ->
    Res =:= ok;
expected(_M, {call, _, owner_exit, _}, Res) ->
    Res =:= ok;
expected(_M, {call, _, subscribe, _}, Res) ->
    Res =:= ok;
expected(_M, {call, _, unsubscribe, _}, Res) ->
    Res =:= ok;
expected(M, {call, _, add, [T, J, _, _]}, Res) ->
    case maps:is_key({T, J}, M#m.jobs) of
        true -> Res =:= {error, already_exists};
        false -> Res =:= ok
    end;
expected(M, {call, _, add_many, [T, List]}, Res) ->
    case add_many_conflicts(M, T, List) of
        [] -> Res =:= ok;
        Ids -> Res =:= {error, {already_exists, Ids}}
    end;
expected(M, {call, _, accept, [{T, W} = K]}, Res) ->
    case maps:is_key(K, M#m.workers) andalso next_job(M, T) of
        false ->
            Res =:= {error, not_found};
        none ->
            Res =:= {error, not_found};
        {ok, J} ->
            #job{prio = P, info = I, attempts = A, result = R0} = maps:get({T, J}, M#m.jobs),
            %% A job run again keeps the result of its last finish.
            Result = case R0 of null -> null; _ -> info(R0) end,
            case Res of
                {ok, #{type := TB, id := J, state := running, worker := W, priority := P, info := Info, attempts := A1,
                        result := Result, cancel_requested := false}} ->
                    TB =:= tbin(T) andalso Info =:= info(I) andalso A1 =:= A + 1;
                _ ->
                    false
            end
    end;
expected(M, {call, _, update, [N, I]}, Res) ->
    case handle_status(M, N) of
        {current, _, #job{cancel_req = true}} ->
            Res =:= {error, canceled};
        {current, {_, J}, _} ->
            case Res of
                {ok, #{id := J, state := running, info := Info}} -> Info =:= info(I);
                _ -> false
            end;
        Error ->
            Res =:= {error, Error}
    end;
expected(M, {call, _, finish, [N, _]}, Res) ->
    case handle_status(M, N) of
        {current, _, _} -> Res =:= ok;
        Error -> Res =:= {error, Error}
    end;
expected(M, {call, _, fail, [N, _, _]}, Res) ->
    case handle_status(M, N) of
        {current, _, _} -> Res =:= ok;
        Error -> Res =:= {error, Error}
    end;
expected(M, {call, _, release, [N]}, Res) ->
    case handle_status(M, N) of
        {current, _, _} -> Res =:= ok;
        Error -> Res =:= {error, Error}
    end;
expected(_M, {call, _, resubmit, _}, Res) ->
    Res =:= ok;
expected(M, {call, _, cancel, [T, J]}, Res) ->
    case maps:is_key({T, J}, M#m.jobs) of
        true -> Res =:= ok;
        false -> Res =:= {error, not_found}
    end;
expected(M, {call, _, remove, [T, J]}, Res) ->
    case maps:is_key({T, J}, M#m.jobs) of
        true -> Res =:= ok;
        false -> Res =:= {error, not_found}
    end;
expected(M, {call, _, bad, [Kind, T, N]}, Res) ->
    Res =:= expected_bad(Kind, M, T, N).

expected_bad(Kind, M, T, N) ->
    case Kind of
        add_type_not_binary -> badarg;
        add_id_not_binary -> badarg;
        add_info_not_map -> badarg;
        add_opts_not_map -> badarg;
        add_info_pid -> {error, invalid_info};
        add_info_tuple -> {error, invalid_info};
        add_info_dup_key -> {error, invalid_info};
        add_info_bad_utf8 -> {error, invalid_info};
        add_info_too_deep -> {error, invalid_info};
        add_priority_float -> {error, invalid_priority};
        add_priority_too_big -> {error, invalid_priority};
        add_id_too_large -> {error, key_too_large};
        add_type_too_large -> {error, key_too_large};
        add_info_too_large -> {error, value_too_large};
        add_many_bogus -> badarg;
        add_many_not_list -> badarg;
        add_many_not_json -> {error, invalid_info};
        add_many_too_large -> {error, value_too_large};
        add_many_id_too_large -> {error, key_too_large};
        register_bad_timeout -> {error, invalid_timeout};
        register_not_json -> {error, invalid_options};
        register_type_not_binary -> badarg;
        register_not_pid -> badarg;
        register_id_too_large -> {error, key_too_large};
        register_opts_too_large -> {error, value_too_large};
        unregister_unknown -> ok;
        unregister_not_ref -> ok;
        unregister_stale -> ok;
        subscribe_not_binary -> badarg;
        subscribe_not_pid -> badarg;
        subscribe_type_too_large -> {error, key_too_large};
        unsubscribe_unknown -> ok;
        get_workers_not_binary -> {error, not_found};
        accept_unknown_ref -> {error, not_found};
        accept_stale_ref -> {error, not_found};
        accept_not_ref -> {error, not_found};
        accept_bad_timeout -> {error, invalid_timeout};
        accept_opts_not_map -> badarg;
        update_not_handle -> badarg;
        update_info_not_json -> {error, invalid_info};
        update_info_too_large -> {error, value_too_large};
        finish_result_not_map -> badarg;
        finish_result_not_json -> {error, invalid_result};
        finish_result_too_large -> {error, value_too_large};
        forged_update -> fenced(M, bad_handle_key(M, T, N));
        forged_finish -> fenced(M, bad_handle_key(M, T, N));
        cross_type_update -> fenced(M, cross_key(M, T, N));
        cross_type_finish -> fenced(M, cross_key(M, T, N));
        other_worker_finish -> fenced(M, bad_handle_key(M, T, N));
        cancel_id_not_binary -> badarg;
        cancel_unknown -> {error, not_found};
        remove_id_too_large -> {error, key_too_large};
        remove_unknown -> {error, not_found};
        get_id_too_large -> {error, key_too_large};
        get_unknown -> {error, not_found};
        count_not_binary -> badarg;
        count_type_too_large -> {error, key_too_large};
        job_subscribe_unknown -> {error, not_found};
        job_subscribe_not_pid -> badarg;
        job_unsubscribe_unknown -> ok
    end.

%% A handle whose fence does not match the record: `not_owner' if a job
%% of that key exists, else `not_found'.
fenced(M, Key) ->
    case maps:is_key(Key, M#m.jobs) of
        true -> {error, not_owner};
        false -> {error, not_found}
    end.

%% The job key a bad handle names: that of handle N, or (T, j1).
bad_handle_key(M, T, N) ->
    case lists:keyfind(N, 1, M#m.handles) of
        {N, Key} -> Key;
        false -> {T, <<"j1">>}
    end.

%% The key a cross-type handle names: handle N's id under the next type.
cross_key(M, T, N) ->
    {T1, J} = bad_handle_key(M, T, N),
    {other_type(T1), J}.
