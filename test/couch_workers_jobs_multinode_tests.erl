%% @doc The job queue on several nodes (separate OS processes) sharing one
%% embedded store, as the nodes of a cluster share one FoundationDB.
%%
%% Node A is this EUnit VM; node B is a peer started with OTP's `peer'
%% over its standard I/O (see couch_workers_multinode_tests). A job added
%% on one node is pushed to an acceptor waiting on the other; `kill -9' of
%% B while its worker runs jobs fails them with `worker_lost' once A's
%% reaper finds the worker dead: back to pending while attempts are left
%% (A's workers finish them), else `failed'. A pause made on A holds B's
%% acceptors; the resume wakes them at once.
-module(couch_workers_jobs_multinode_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [register_worker/3, wait_job/3]).

%% Run on the peer (through peer:call/4).
-export([peer_worker/4, peer_accept_blocking/3]).

-define(PEER_TIMEOUT, 15000).

jobs_multinode_test_() ->
    couch_workers_test_util:peer_fixture(
        "couch_workers job queue on several nodes",
        "jmn",
        [
            ?TDEF_FE(job_added_here_is_pushed_to_peer_acceptor, 60),
            ?TDEF_FE(kill_9_of_peer_sends_its_jobs_back_to_pending, 30),
            ?TDEF_FE(kill_9_spends_an_attempt_and_ends_in_worker_lost, 30),
            ?TDEF_FE(pause_here_stops_acceptors_there_and_resume_wakes_them, 40)
        ]
    ).

%% ---- tests ---------------------------------------------------------------

job_added_here_is_pushed_to_peer_acceptor(#{peer := Peer, type := T}) ->
    %% B waits (up to 20 s) for a job of T; A adds one after B waits.
    Self = self(),
    Waiter = spawn_link(fun() ->
        Self ! {peer_got, peer:call(Peer, ?MODULE, peer_accept_blocking, [T, <<"b1">>, 20000], 25000)}
    end),
    %% Let B's acceptor reach its dispatcher.
    timer:sleep(1000),
    T0 = erlang:monotonic_time(millisecond),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"from">> => <<"A">>}, #{}),
    Got =
        receive
            {peer_got, R} -> R
        after 25000 -> error(peer_accept_timeout)
        end,
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    ?assertEqual({ok, <<"j1">>, <<"b1">>, 1}, Got),
    %% Pushed by a store watch, not found at the end of the 20 s wait
    %% (half of it is room for a loaded machine).
    ?assert(Elapsed < 10000),
    ?assertMatch({ok, #{state := finished, result := #{<<"by">> := <<"b1">>}}}, couch_workers:job_get(T, <<"j1">>)),
    unlink(Waiter).

kill_9_of_peer_sends_its_jobs_back_to_pending(#{peer := Peer, os_pid := OsPid, type := T}) ->
    TimeoutS = 2,
    Ids = [<<"j1">>, <<"j2">>, <<"j3">>],
    ok = couch_workers:job_add_many(T, [{Id, #{<<"n">> => N}, #{}} || {N, Id} <- lists:enumerate(Ids)]),
    Subs = [
        begin
            {ok, S, #{state := pending}} = couch_workers:job_subscribe(T, Id, self()),
            {Id, S}
        end
     || Id <- Ids
    ],
    %% B's worker (timeout 2 s) takes all three and keeps them running.
    ?assertEqual({ok, Ids}, peer:call(Peer, ?MODULE, peer_worker, [T, <<"b1">>, TimeoutS, 3], ?PEER_TIMEOUT)),
    [
        ?assertMatch(#{state := running, worker := <<"b1">>, attempts := 1}, wait_job(S, fun(_) -> true end, 5000))
     || {_, S} <- Subs
    ],
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    T0 = erlang:monotonic_time(millisecond),
    "" = os:cmd("kill -9 " ++ OsPid),
    %% Each subscriber sees its job go back to pending, within the
    %% worker's timeout plus a second.
    Back = [
        wait_job(S, fun(#{state := St}) -> St =:= pending end, (TimeoutS + 5) * 1000)
     || {_, S} <- Subs
    ],
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    io:format(standard_error, "~n    jobs of the killed node back to pending after ~b ms (timeout ~b s)~n", [
        Elapsed, TimeoutS
    ]),
    [?assertMatch(#{state := pending, worker := null, attempts := 1}, J) || J <- Back],
    ?assert(Elapsed =< (TimeoutS + 1) * 1000),
    ?assertEqual(3, couch_workers:job_pending_count(T)),
    %% A worker here takes and finishes them, in their order.
    W = register_worker(T, <<"a1">>, #{}),
    Handles = [
        begin
            {ok, #{id := Id} = H} = couch_workers:job_accept(W, #{}),
            ?assertMatch(#{worker := <<"a1">>, attempts := 2}, H),
            ok = couch_workers:job_finish(H, #{<<"by">> => <<"a1">>}),
            Id
        end
     || _ <- Ids
    ],
    ?assertEqual(Ids, Handles),
    [
        ?assertMatch(
            {ok, #{state := finished, attempts := 2, result := #{<<"by">> := <<"a1">>}}},
            couch_workers:job_get(T, Id)
        )
     || Id <- Ids
    ],
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    [ok = couch_workers:job_unsubscribe(S) || {_, S} <- Subs],
    ok = couch_workers:worker_unregister(W).

%% A death spends an attempt (the contract): a job that kills every node it
%% runs on ends `failed' with `worker_lost' instead of cycling forever.
kill_9_spends_an_attempt_and_ends_in_worker_lost(#{peer := Peer, os_pid := OsPid, type := T}) ->
    TimeoutS = 2,
    ok = couch_workers:job_add(T, <<"last">>, #{}, #{max_attempts => 1}),
    ok = couch_workers:job_add(T, <<"more">>, #{}, #{max_attempts => 2}),
    {ok, SL, _} = couch_workers:job_subscribe(T, <<"last">>, self()),
    {ok, SM, _} = couch_workers:job_subscribe(T, <<"more">>, self()),
    ?assertEqual({ok, [<<"last">>, <<"more">>]}, peer:call(Peer, ?MODULE, peer_worker, [T, <<"b1">>, TimeoutS, 2], ?PEER_TIMEOUT)),
    wait_job(SL, fun(#{state := St}) -> St =:= running end, 5000),
    wait_job(SM, fun(#{state := St}) -> St =:= running end, 5000),
    "" = os:cmd("kill -9 " ++ OsPid),
    Lost = #{<<"reason">> => <<"worker_lost">>},
    ?assertMatch(
        #{state := failed, attempts := 1, error := Lost, worker := null},
        wait_job(SL, fun(#{state := St}) -> St =/= running end, (TimeoutS + 5) * 1000)
    ),
    ?assertMatch(
        #{state := pending, attempts := 1, error := Lost},
        wait_job(SM, fun(#{state := St}) -> St =/= running end, (TimeoutS + 5) * 1000)
    ),
    ?assertMatch(#{failed := 1, pending := 1, running := 0}, couch_workers:job_counts(T)),
    [ok = couch_workers:job_unsubscribe(S) || S <- [SL, SM]].

%% The pause is cluster-wide: paused here, the peer's acceptor waits past
%% a pending job; resumed here, it gets the job at once.
pause_here_stops_acceptors_there_and_resume_wakes_them(#{peer := Peer, type := T}) ->
    ok = couch_workers:job_pause(T),
    ok = couch_workers:job_pause(T),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual({error, not_found}, peer:call(Peer, ?MODULE, peer_accept_blocking, [T, <<"b1">>, 1500], ?PEER_TIMEOUT)),
    %% Adds, cancels and removes still work while paused.
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    ok = couch_workers:job_cancel(T, <<"j2">>),
    ok = couch_workers:job_remove(T, <<"j2">>),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    Self = self(),
    Waiter = spawn_link(fun() ->
        Self ! {peer_got, peer:call(Peer, ?MODULE, peer_accept_blocking, [T, <<"b2">>, 20000], 25000)}
    end),
    timer:sleep(1500),
    T0 = erlang:monotonic_time(millisecond),
    ok = couch_workers:job_resume(T),
    Got =
        receive
            {peer_got, R} -> R
        after 25000 -> error(peer_accept_timeout)
        end,
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    ?assertEqual({ok, <<"j1">>, <<"b2">>, 1}, Got),
    %% Woken by the resume's bump, not by the end of its 20 s wait (half
    %% of it is room for a loaded machine).
    ?assert(Elapsed < 10000),
    ok = couch_workers:job_resume(T),
    unlink(Waiter).

%% ---- run on the peer -----------------------------------------------------

%% A long-lived worker process of the peer: registers worker Id (health
%% timeout TimeoutS) and accepts N jobs, which it keeps running. Answers
%% the ids (references and handles do not travel well between
%% non-distributed nodes).
peer_worker(Type, Id, TimeoutS, N) ->
    Caller = self(),
    spawn(fun() ->
        W = couch_workers:worker_register(Type, Id, #{timeout => TimeoutS}, self()),
        Taken = [
            case couch_workers:job_accept(W, #{timeout => 5000}) of
                {ok, #{id := JobId}} -> JobId;
                Error -> Error
            end
         || _ <- lists:seq(1, N)
        ],
        Caller ! {taken, Taken},
        receive
            stop -> ok
        end
    end),
    receive
        {taken, Taken} -> {ok, Taken}
    after 10000 -> {error, timeout}
    end.

%% Registers worker Id and waits up to Timeout ms for a job; finishes it.
peer_accept_blocking(Type, Id, Timeout) ->
    W = couch_workers:worker_register(Type, Id, #{}, self()),
    case couch_workers:job_accept(W, #{timeout => Timeout}) of
        {ok, #{id := JobId, worker := Worker, attempts := A} = Job} ->
            ok = couch_workers:job_finish(Job, #{<<"by">> => Worker}),
            ok = couch_workers:worker_unregister(W),
            {ok, JobId, Worker, A};
        Error ->
            Error
    end.
