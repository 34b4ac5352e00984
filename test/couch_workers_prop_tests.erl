%% @doc Random operations against a model (issue 6, part 2): PropEr
%% stateful tests of the whole public API.
%%
%% Each sequence draws calls of register, unregister, owner exits (kill
%% and normal), membership subscribe/unsubscribe, job add/add_many,
%% accept (timeout 0), update, finish, fail (no retry, or retried at
%% once), release, resubmit (with priority and max_attempts, in every
%% state), cancel, remove, and bad inputs of
%% every kind (wrong types, maps JSON cannot hold, unknown and stale
%% references, forged and cross-type handles, keys and values over the
%% limits), and checks after every call, against a simple model:
%%
%% * the call's result is the model's;
%% * every job of the sequence's types and ids (`job_get' of each) is in
%%   exactly the model's state, with its worker, priority, info, result,
%%   error, attempts, max_attempts and cancel request; every other id is
%%   `not_found';
%% * the pending count and `job_counts/1' of each type are the model's;
%% * no running job (as `job_get' says) without a live registered owner:
%%   its worker is registered on this node (the registration table) and
%%   the owner process is alive;
%% * the membership: for a type with a subscription, `get_workers/1'
%%   settles to exactly the registered set with its options; without one
%%   it is `not_found';
%% * the app runs, with the same server processes as at the start (no
%%   crash and restart hides anywhere).
%%
%% The model is exact because every call is deterministic: accepts use
%% timeout 0; an unregister returns after its write (DESIGN.md: "every
%% call that returns has finished its write"); after an owner exits, the
%% harness waits for its `DOWN', then until `couch_workers_local' has
%% taken each of its workers out (its own `DOWN' came: the exit is a
%% death, which fails the running jobs, where an unregister releases
%% them), and then calls `worker_unregister/1' on their references, which
%% returns once the removal the exit started has been written
%% (`couch_workers_local' answers it from its `unregistering' table).
%% Failover order is the store's: a removed
%% worker's jobs go back to pending in active-key order (job id byte
%% order) behind every job already pending of their priority. An owner
%% exit of several workers that run jobs would requeue them in an order
%% the model cannot know (the order of the monitors' `DOWN's), so an
%% owner exit is drawn only while at most one of its workers runs jobs.
%%
%% Types and ids look like one another and like the key space's names:
%% types `P', `P\0' and `P\0pending' (a fresh `P' per sequence), job ids
%% `j1', `j2', `j1\0', `', `\0', `jobs', worker ids `w1', `w2', `w1\0', `'.
%%
%% PropEr is used without its header (Debian's `erlang-proper' ships no
%% `proper.hrl'; that is in `erlang-proper-dev'): `?FORALL' is
%% `proper:forall/2' and so on, written out.
%%
%% EUnit runs COUCH_WORKERS_PROPER_NUMTESTS sequences (default 250) of
%% 0 to 50 calls (25 on average); `scripts/proper_long.sh' runs about
%% 10^5 calls.
-module(couch_workers_prop_tests).

-include_lib("eunit/include/eunit.hrl").

-behaviour(proper_statem).

-export([initial_state/0, command/1, precondition/2, postcondition/3, next_state/3]).
%% The commands.
-export([
    register/4,
    unregister/1,
    owner_exit/2,
    subscribe/1,
    unsubscribe/1,
    add/4,
    add_many/2,
    accept/1,
    update/2,
    finish/2,
    cancel/2,
    remove/2,
    fail/3,
    release/1,
    resubmit/5,
    bad/3
]).
%% For scripts/proper_long.sh.
-export([run/2, prop_model/0]).

-define(TYPES, [a, b, c]).
-define(JOB_IDS, [<<"j1">>, <<"j2">>, <<"j1", 0>>, <<>>, <<0>>, <<"jobs">>]).
-define(WORKER_IDS, [<<"w1">>, <<"w2">>, <<"w1", 0>>, <<>>]).
-define(OWNERS, [1, 2, 3]).
-define(PRIORITIES, [0, 0, 0, 1, -1, 9223372036854775807, -9223372036854775808]).
-define(N_INFOS, 5).
-define(KEY_LIMIT, 10000).
-define(VALUE_LIMIT, 100000).
-define(SERVERS, [couch_workers_sup, couch_workers_events, couch_workers_global, couch_workers_local, couch_workers_jobs_subs]).
-define(STATS_TAB, couch_workers_prop_stats).

-define(BAD, [
    add_type_not_binary,
    add_id_not_binary,
    add_info_not_map,
    add_opts_not_map,
    add_info_pid,
    add_info_tuple,
    add_info_dup_key,
    add_info_bad_utf8,
    add_info_too_deep,
    add_priority_float,
    add_priority_too_big,
    add_id_too_large,
    add_type_too_large,
    add_info_too_large,
    add_many_bogus,
    add_many_not_list,
    add_many_not_json,
    add_many_too_large,
    add_many_id_too_large,
    register_bad_timeout,
    register_not_json,
    register_type_not_binary,
    register_not_pid,
    register_id_too_large,
    register_opts_too_large,
    unregister_unknown,
    unregister_not_ref,
    unregister_stale,
    subscribe_not_binary,
    subscribe_not_pid,
    subscribe_type_too_large,
    unsubscribe_unknown,
    get_workers_not_binary,
    accept_unknown_ref,
    accept_stale_ref,
    accept_not_ref,
    accept_bad_timeout,
    accept_opts_not_map,
    update_not_handle,
    update_info_not_json,
    update_info_too_large,
    finish_result_not_map,
    finish_result_not_json,
    finish_result_too_large,
    forged_update,
    forged_finish,
    cross_type_update,
    cross_type_finish,
    other_worker_finish,
    cancel_id_not_binary,
    cancel_unknown,
    remove_id_too_large,
    remove_unknown,
    get_id_too_large,
    get_unknown,
    count_not_binary,
    count_type_too_large,
    job_subscribe_unknown,
    job_subscribe_not_pid,
    job_unsubscribe_unknown
]).

%% ---- the model -------------------------------------------------------------

-record(job, {
    state = pending :: pending | running | finished | canceled | failed,
    worker = null :: null | binary(),
    prio = 0 :: integer(),
    info = 0 :: non_neg_integer(),
    result = null :: null | non_neg_integer(),
    attempts = 0 :: non_neg_integer(),
    cancel_req = false :: boolean(),
    %% FIFO position while pending: {transaction counter, index in it}
    seq = undefined :: undefined | {non_neg_integer(), non_neg_integer()},
    %% the accept (handle number) that holds it while running
    acc = undefined :: undefined | pos_integer(),
    max = 20 :: pos_integer(),
    %% the info number of the last failure's error; worker_lost for a death
    error = null :: null | non_neg_integer() | worker_lost,
    %% a resubmission waiting for the end of the run: {Info, Prio, Max}
    resub = undefined :: undefined | {non_neg_integer(), integer(), pos_integer()}
}).

-record(m, {
    %% {Type, WorkerId} => {Owner, OptsN}
    workers = #{} :: #{{atom(), binary()} => {pos_integer(), pos_integer()}},
    %% {Type, JobId} => #job{}
    jobs = #{} :: #{{atom(), binary()} => #job{}},
    %% Type => number of membership subscriptions
    subs = #{} :: #{atom() => pos_integer()},
    %% transactions that made jobs pending
    counter = 0 :: non_neg_integer(),
    %% accepts so far (handle numbers)
    accepts = 0 :: non_neg_integer(),
    %% handles given out: [{N, {Type, JobId}}], newest first, at most 12
    handles = [] :: [{pos_integer(), {atom(), binary()}}]
}).

initial_state() ->
    #m{}.

command(M) ->
    Registered = maps:keys(M#m.workers),
    AnyWorker = {proper_types:oneof(?TYPES), proper_types:oneof(?WORKER_IDS)},
    Subscribed = maps:keys(M#m.subs),
    Handles = [N || {N, _} <- M#m.handles],
    Type = proper_types:oneof(?TYPES),
    Id = proper_types:oneof(?JOB_IDS),
    Info = proper_types:choose(0, ?N_INFOS - 1),
    Prio = proper_types:oneof(?PRIORITIES),
    Exitable = [O || O <- ?OWNERS, exitable(M, O)],
    proper_types:frequency(
        [
            {4, {call, ?MODULE, register, [Type, proper_types:oneof(?WORKER_IDS), proper_types:oneof(?OWNERS), proper_types:choose(1, 3)]}},
            {1, {call, ?MODULE, unregister, [AnyWorker]}},
            {1, {call, ?MODULE, subscribe, [Type]}},
            {6, {call, ?MODULE, add, [Type, Id, Info, Prio]}},
            {2, {call, ?MODULE, add_many, [Type, proper_types:resize(4, proper_types:list({Id, Info, Prio}))]}},
            {2, {call, ?MODULE, accept, [AnyWorker]}},
            {2, {call, ?MODULE, cancel, [Type, Id]}},
            {2, {call, ?MODULE, remove, [Type, Id]}},
            {3, {call, ?MODULE, resubmit, [Type, Id, Info, Prio, proper_types:oneof([1, 2, 20])]}},
            {4, {call, ?MODULE, bad, [proper_types:oneof(?BAD), Type, proper_types:oneof([0 | Handles])]}}
        ] ++
            [{3, {call, ?MODULE, unregister, [proper_types:oneof(Registered)]}} || Registered =/= []] ++
            [{8, {call, ?MODULE, accept, [proper_types:oneof(Registered)]}} || Registered =/= []] ++
            [{1, {call, ?MODULE, owner_exit, [proper_types:oneof(Exitable), proper_types:oneof([kill, normal])]}} || Exitable =/= []] ++
            [{1, {call, ?MODULE, unsubscribe, [proper_types:oneof(Subscribed)]}} || Subscribed =/= []] ++
            [{5, {call, ?MODULE, update, [proper_types:oneof(Handles), Info]}} || Handles =/= []] ++
            [{5, {call, ?MODULE, finish, [proper_types:oneof(Handles), Info]}} || Handles =/= []] ++
            [{3, {call, ?MODULE, fail, [proper_types:oneof(Handles), Info, proper_types:oneof([false, 0])]}} || Handles =/= []] ++
            [{2, {call, ?MODULE, release, [proper_types:oneof(Handles)]}} || Handles =/= []]
    ).

precondition(M, {call, _, owner_exit, [O, _]}) ->
    exitable(M, O);
precondition(M, {call, _, unsubscribe, [T]}) ->
    maps:is_key(T, M#m.subs);
precondition(M, {call, _, update, [N, _]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, finish, [N, _]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, fail, [N, _, _]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, release, [N]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, bad, [_, _, N]}) ->
    N =:= 0 orelse lists:keymember(N, 1, M#m.handles);
precondition(_M, _Call) ->
    true.

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

%% ---- postconditions: the result, then the whole world ---------------------------

postcondition(M, Call, Res) ->
    case expected(M, Call, Res) of
        true ->
            try
                check_world(next_state(M, Res, Call)),
                true
            catch
                throw:{check_failed, What} ->
                    put(prop_failure, {world, What}),
                    false
            end;
        false ->
            put(prop_failure, {result, Call, Res}),
            false
    end.

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

other_type(a) -> b;
other_type(b) -> c;
other_type(c) -> a.

%% ---- the world -------------------------------------------------------------------

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

%% ---- the commands ------------------------------------------------------------------
%%
%% The harness (this process's dictionary, per sequence): {wref, Key} =>
%% {Ref, Owner} for registered workers; stale => old refs; {owner, O} =>
%% pid; {handle, N} => the handle of accept N; accepts => N; {subs, T} =>
%% [Ref].

register(T, W, O, OptsN) ->
    R = couch_workers:worker_register(tbin(T), W, opts(OptsN), owner(O)),
    case {R, get({wref, {T, W}})} of
        {Ref, undefined} when is_reference(Ref) ->
            put({wref, {T, W}}, {Ref, O}),
            {registered, new};
        {Ref, {Ref, _}} ->
            {registered, same};
        {Ref, {_, _}} when is_reference(Ref) ->
            {registered, different};
        {Other, _} ->
            Other
    end.

unregister(K) ->
    case erase({wref, K}) of
        {Ref, _} ->
            put(stale, [Ref | get(stale)]),
            couch_workers:worker_unregister(Ref);
        undefined ->
            %% Not registered: a stale or unknown reference.
            couch_workers:worker_unregister(stale_ref())
    end.

%% The owner exits (killed, or normally); once it is gone and
%% `couch_workers_local' has seen it go (so that the removal is the
%% exit's, a death, and not an unregister of the harness, a release),
%% each of its workers' `worker_unregister/1' returns when the removal
%% that the exit started has been written.
owner_exit(O, How) ->
    Pid = get({owner, O}),
    Mon = erlang:monitor(process, Pid),
    case How of
        kill -> exit(Pid, kill);
        normal -> Pid ! stop
    end,
    receive
        {'DOWN', Mon, process, Pid, _} -> ok
    end,
    put({owner, O}, spawn_owner()),
    Mine = [{K, Ref} || {{wref, K}, {Ref, O1}} <- get(), O1 =:= O],
    couch_workers_test_util:wait_for(
        fun() -> lists:all(fun({_K, Ref}) -> couch_workers_local:lookup(Ref) =:= error end, Mine) end,
        5000
    ),
    Results = [
        begin
            erase({wref, K}),
            put(stale, [Ref | get(stale)]),
            couch_workers:worker_unregister(Ref)
        end
     || {K, Ref} <- Mine
    ],
    case lists:usort(Results) of
        [] -> ok;
        [ok] -> ok;
        Other -> Other
    end.

subscribe(T) ->
    case couch_workers:membership_subscribe(tbin(T), nil, self()) of
        Ref when is_reference(Ref) ->
            put({subs, T}, get_list({subs, T}) ++ [Ref]),
            ok;
        Other ->
            Other
    end.

unsubscribe(T) ->
    [Ref | Rest] = get_list({subs, T}),
    put({subs, T}, Rest),
    couch_workers:membership_unsubscribe(Ref).

add(T, J, I, P) ->
    couch_workers:job_add(tbin(T), J, info(I), #{priority => P}).

add_many(T, List) ->
    couch_workers:job_add_many(tbin(T), [{J, info(I), #{priority => P}} || {J, I, P} <- List]).

accept(K) ->
    Ref =
        case get({wref, K}) of
            {R, _} -> R;
            undefined -> stale_ref()
        end,
    case couch_workers:job_accept(Ref, #{timeout => 0}) of
        {ok, Handle} = Ok ->
            N = get(accepts) + 1,
            put(accepts, N),
            put({handle, N}, Handle),
            Ok;
        Other ->
            Other
    end.

update(N, I) ->
    case couch_workers:job_update(get({handle, N}), info(I)) of
        {ok, Handle} = Ok ->
            put({handle, N}, Handle),
            Ok;
        Other ->
            Other
    end.

finish(N, R) ->
    couch_workers:job_finish(get({handle, N}), info(R)).

cancel(T, J) ->
    couch_workers:job_cancel(tbin(T), J).

remove(T, J) ->
    couch_workers:job_remove(tbin(T), J).

fail(N, E, false) ->
    couch_workers:job_fail(get({handle, N}), info(E), #{retry => false});
fail(N, E, Delay) ->
    couch_workers:job_fail(get({handle, N}), info(E), #{delay => Delay}).

release(N) ->
    couch_workers:job_release(get({handle, N}), #{}).

resubmit(T, J, I, P, Max) ->
    couch_workers:job_resubmit(tbin(T), J, info(I), #{priority => P, max_attempts => Max}).

bad(Kind, T, N) ->
    try
        do_bad(Kind, tbin(T), T, N)
    catch
        error:badarg -> badarg
    end.

do_bad(Kind, TB, T, N) ->
    J = <<"j1">>,
    BigKey = binary:copy(<<"k">>, ?KEY_LIMIT + 1),
    Huge = #{<<"blob">> => binary:copy(<<"v">>, ?VALUE_LIMIT + 1)},
    case Kind of
        add_type_not_binary -> couch_workers:job_add(42, J, #{}, #{});
        add_id_not_binary -> couch_workers:job_add(TB, j1, #{}, #{});
        add_info_not_map -> couch_workers:job_add(TB, J, [], #{});
        add_opts_not_map -> couch_workers:job_add(TB, J, #{}, [{priority, 1}]);
        add_info_pid -> couch_workers:job_add(TB, J, #{p => self()}, #{});
        add_info_tuple -> couch_workers:job_add(TB, J, #{t => {1, 2}}, #{});
        add_info_dup_key -> couch_workers:job_add(TB, J, #{a => 1, <<"a">> => 2}, #{});
        add_info_bad_utf8 -> couch_workers:job_add(TB, J, #{s => <<255, 254>>}, #{});
        add_info_too_deep -> couch_workers:job_add(TB, J, deep(70), #{});
        add_priority_float -> couch_workers:job_add(TB, J, #{}, #{priority => 1.5});
        add_priority_too_big -> couch_workers:job_add(TB, J, #{}, #{priority => 1 bsl 63});
        add_id_too_large -> couch_workers:job_add(TB, BigKey, #{}, #{});
        add_type_too_large -> couch_workers:job_add(BigKey, J, #{}, #{});
        add_info_too_large -> couch_workers:job_add(TB, J, Huge, #{});
        add_many_bogus -> couch_workers:job_add_many(TB, [{<<"nope">>, #{}, #{}}, bogus]);
        add_many_not_list -> couch_workers:job_add_many(TB, #{});
        add_many_not_json -> couch_workers:job_add_many(TB, [{<<"nope">>, #{}, #{}}, {<<"nope2">>, #{f => fun erlang:self/0}, #{}}]);
        add_many_too_large -> couch_workers:job_add_many(TB, [{<<"nope">>, #{}, #{}}, {<<"nope2">>, Huge, #{}}]);
        add_many_id_too_large -> couch_workers:job_add_many(TB, [{<<"nope">>, #{}, #{}}, {BigKey, #{}, #{}}]);
        register_bad_timeout -> couch_workers:worker_register(TB, <<"bad-w">>, #{timeout => 0}, self());
        register_not_json -> couch_workers:worker_register(TB, <<"bad-w">>, #{f => fun erlang:self/0}, self());
        register_type_not_binary -> couch_workers:worker_register(t, <<"bad-w">>, #{}, self());
        register_not_pid -> couch_workers:worker_register(TB, <<"bad-w">>, #{}, self);
        register_id_too_large -> couch_workers:worker_register(TB, BigKey, #{}, self());
        register_opts_too_large -> couch_workers:worker_register(TB, <<"bad-w">>, Huge, self());
        unregister_unknown -> couch_workers:worker_unregister(make_ref());
        unregister_not_ref -> couch_workers:worker_unregister(<<"w1">>);
        unregister_stale -> couch_workers:worker_unregister(stale_ref());
        subscribe_not_binary -> couch_workers:membership_subscribe(42, nil, self());
        subscribe_not_pid -> couch_workers:membership_subscribe(TB, nil, self);
        subscribe_type_too_large -> couch_workers:membership_subscribe(BigKey, nil, self());
        unsubscribe_unknown -> couch_workers:membership_unsubscribe(make_ref());
        get_workers_not_binary -> couch_workers:get_workers(42);
        accept_unknown_ref -> couch_workers:job_accept(make_ref(), #{});
        accept_stale_ref -> couch_workers:job_accept(stale_ref(), #{});
        accept_not_ref -> couch_workers:job_accept(<<"w1">>, #{});
        accept_bad_timeout -> couch_workers:job_accept(any_worker_ref(), #{timeout => -1});
        accept_opts_not_map -> couch_workers:job_accept(any_worker_ref(), [{timeout, 0}]);
        update_not_handle -> couch_workers:job_update(#{type => TB, id => J}, #{});
        update_info_not_json -> couch_workers:job_update(some_handle(TB, N), #{p => self()});
        update_info_too_large -> couch_workers:job_update(some_handle(TB, N), Huge);
        finish_result_not_map -> couch_workers:job_finish(some_handle(TB, N), [1]);
        finish_result_not_json -> couch_workers:job_finish(some_handle(TB, N), #{r => make_ref()});
        finish_result_too_large -> couch_workers:job_finish(some_handle(TB, N), Huge);
        forged_update -> couch_workers:job_update((some_handle(TB, N))#{token := <<0:128>>}, #{});
        forged_finish -> couch_workers:job_finish((some_handle(TB, N))#{token := crypto:strong_rand_bytes(16)}, #{});
        cross_type_update -> couch_workers:job_update(cross(some_handle(TB, N), T, N), #{});
        cross_type_finish -> couch_workers:job_finish(cross(some_handle(TB, N), T, N), #{});
        other_worker_finish -> couch_workers:job_finish((some_handle(TB, N))#{worker := <<"someone-else">>}, #{});
        cancel_id_not_binary -> couch_workers:job_cancel(TB, 1);
        cancel_unknown -> couch_workers:job_cancel(TB, <<"nope">>);
        remove_id_too_large -> couch_workers:job_remove(TB, BigKey);
        remove_unknown -> couch_workers:job_remove(TB, <<"nope">>);
        get_id_too_large -> couch_workers:job_get(TB, BigKey);
        get_unknown -> couch_workers:job_get(TB, <<"nope">>);
        count_not_binary -> couch_workers:job_pending_count(42);
        count_type_too_large -> couch_workers:job_pending_count(BigKey);
        job_subscribe_unknown -> couch_workers:job_subscribe(TB, <<"nope">>, self());
        job_subscribe_not_pid -> couch_workers:job_subscribe(TB, J, nobody);
        job_unsubscribe_unknown -> couch_workers:job_unsubscribe(make_ref())
    end.

%% Handle N, or a made-up handle of (T, j1) when N is 0.
some_handle(TB, 0) ->
    #{type => TB, id => <<"j1">>, worker => <<"w1">>, token => <<0:128>>};
some_handle(_TB, N) ->
    get({handle, N}).

cross(Handle, T, 0) ->
    Handle#{type := tbin(other_type(T))};
cross(#{type := TB} = Handle, _T, _N) ->
    Handle#{type := tbin(other_type(tsym(TB)))}.

owner(O) ->
    get({owner, O}).

stale_ref() ->
    case get(stale) of
        [Ref | _] -> Ref;
        _ -> make_ref()
    end.

any_worker_ref() ->
    case [Ref || {{wref, _}, {Ref, _}} <- get()] of
        [Ref | _] -> Ref;
        [] -> make_ref()
    end.

get_list(Key) ->
    case get(Key) of
        undefined -> [];
        L -> L
    end.

%% ---- values ---------------------------------------------------------------------------

tbin(a) -> get(prefix);
tbin(b) -> <<(get(prefix))/binary, 0>>;
tbin(c) -> <<(get(prefix))/binary, 0, "pending">>.

tsym(TB) ->
    hd([T || T <- ?TYPES, tbin(T) =:= TB]).

%% Infos and results, as given; info/1 is also what comes back (binary
%% keys), except where noted.
info(0) -> #{};
info(1) -> #{<<"n">> => 1};
info(2) -> #{<<"k">> => <<"v">>, <<"l">> => [1, 2.5, true, false, null, <<"s">>], <<"neg">> => -9223372036854775808};
info(3) -> #{<<"nested">> => #{<<"a">> => #{<<"b">> => [#{}, []]}}, <<"u">> => <<"é€"/utf8>>};
%% Big, but a record can hold four of them at once (info, result, error,
%% and the info of a resubmission waiting for the run's end), and four
%% must fit the value limit (100,000 bytes): at 45,000 bytes a finish
%% after a failure with big info and error was refused as value_too_large,
%% which the model does not expect (a PropEr counterexample, 1 Dec 2026).
info(4) -> #{<<"big">> => binary:copy(<<"x">>, 22000)}.

opts(N) -> #{timeout => 30, n => N}.
opts_json(N) -> #{<<"timeout">> => 30, <<"n">> => N}.

deep(0) -> #{};
deep(N) -> #{d => deep(N - 1)}.

%% ---- sequences -----------------------------------------------------------------------

spawn_owner() ->
    spawn(fun() ->
        receive
            stop -> ok
        end
    end).

start_sequence() ->
    put(prefix, iolist_to_binary(["prop", integer_to_list(erlang:unique_integer([positive]))])),
    put(stale, []),
    put(accepts, 0),
    put(servers, [whereis(S) || S <- ?SERVERS]),
    [put({owner, O}, spawn_owner()) || O <- ?OWNERS],
    ok.

end_sequence() ->
    [ok = couch_workers:worker_unregister(Ref) || {{wref, _}, {Ref, _}} <- get()],
    [ok = couch_workers:membership_unsubscribe(Ref) || {{subs, _}, Refs} <- get(), Ref <- Refs],
    [exit(Pid, kill) || {{owner, _}, Pid} <- get()],
    flush_membership(),
    %% Only the harness's keys: PropEr keeps its own state in the
    %% process dictionary too.
    [erase(K) || {K, _} <- get(), harness_key(K)],
    ok.

harness_key({wref, _}) -> true;
harness_key({owner, _}) -> true;
harness_key({handle, _}) -> true;
harness_key({subs, _}) -> true;
harness_key(K) -> lists:member(K, [prefix, stale, accepts, servers, prop_failure]).

prop_model() ->
    proper:forall(
        proper_statem:commands(?MODULE),
        fun(Cmds) ->
            start_sequence(),
            erase(prop_failure),
            {History, State, Result} = proper_statem:run_commands(?MODULE, Cmds),
            Failure = get(prop_failure),
            end_sequence(),
            count(sequences, 1),
            count(calls, length(History)),
            Executed = lists:sublist([call_name(C) || {set, _, C} <- Cmds], length(History)),
            [count({call, F}, 1) || F <- Executed],
            proper:whenfail(
                fun() ->
                    io:format(standard_error, "~nfailed: ~P~nfailure: ~P~nlast model: ~P~nresults (last 5): ~P~n", [
                        Result, 40, Failure, 40, State, 40, [R || {_, R} <- lists:sublist(lists:reverse(History), 5)], 40
                    ])
                end,
                fun() -> Result =:= ok end
            )
        end
    ).

call_name({call, _, bad, [Kind | _]}) -> {bad, Kind};
call_name({call, _, F, _}) -> F.

count(Key, N) ->
    ets:update_counter(?STATS_TAB, Key, N, {Key, 0}).

%% Runs NumTests sequences of 0..Size calls (uniformly: PropEr stops a
%% sequence with probability 1/(Size - Length + 1)); every test gets the
%% same size (resize/more_commands do not reach the sized generator of
%% commands in PropEr 1.2, so the size is set here); returns
%% {Passed, #{sequences, calls, per_command}}.
run(NumTests, Size) ->
    case ets:info(?STATS_TAB) of
        undefined -> ets:new(?STATS_TAB, [named_table, public, set]);
        _ -> ets:delete_all_objects(?STATS_TAB)
    end,
    T0 = erlang:monotonic_time(millisecond),
    Passed = proper:quickcheck(prop_model(), [{numtests, NumTests}, {start_size, Size}, {max_size, Size}, quiet, {max_shrinks, 200}]),
    Ms = erlang:monotonic_time(millisecond) - T0,
    Stats = maps:from_list(ets:tab2list(?STATS_TAB)),
    PerCommand = lists:sort([{F, C} || {{call, F}, C} <- maps:to_list(Stats)]),
    Figures = #{
        sequences => maps:get(sequences, Stats, 0),
        calls => maps:get(calls, Stats, 0),
        per_command => PerCommand,
        ms => Ms
    },
    case Passed of
        true -> ok;
        _ -> io:format(standard_error, "~ncounterexample: ~p~n", [proper:counterexample()])
    end,
    {Passed, Figures}.

%% ---- EUnit ---------------------------------------------------------------------------

prop_test_() ->
    {
        "PropEr: random API sequences checked against a model after every call",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            fun(_) -> {timeout, 600, ?_test(run_ci())} end
        }
    }.

run_ci() ->
    NumTests = couch_workers_test_util:env_int("COUCH_WORKERS_PROPER_NUMTESTS", 250),
    Before = couch_workers_test_util:counts(),
    {Passed, #{sequences := S, calls := C, per_command := Per, ms := Ms}} = run(NumTests, 50),
    io:format(
        standard_error,
        "~n    PropEr: ~b sequences, ~b calls (avg ~.1f per sequence), ~b ms, passed: ~p~n    calls per command: ~p~n",
        [S, C, C / max(1, S), Ms, Passed, Per]
    ),
    ?assertEqual(true, Passed),
    ?assert(S >= NumTests),
    %% Every sequence cleaned up after itself: nothing of it is left.
    couch_workers_test_util:wait_for(fun() -> couch_workers_test_util:counts() =:= Before end, 5000).
