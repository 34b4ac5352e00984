%% @doc The membership delta path (the benchmark's M4).
%%
%% After its first message, which holds the whole membership, a NIF
%% watcher sends mostly only what changed, and couch_workers_global
%% applies that to the map it keeps. These tests make joins, leaves and
%% new options (on this node, and from a second `erl' node) and check after
%% every step, at the same versionstamp, that a fresh whole read of the
%% member range (the first message of a new NIF watch) equals
%%   - the map rebuilt from a NIF watch's messages, deltas applied here;
%%   - the whole `Workers' of a message subscription and of a callback
%%     subscription;
%%   - get_workers/1.
%% And that the steps of one change went as deltas, while the step that
%% empties the membership went whole (a change not smaller than the
%% membership).
-module(couch_workers_membership_delta_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, recv_callback/2, set_sink/2, clear_sink/1]).

%% Run on the peer (through peer:call/4).
-export([peer_apply/2]).

-define(PEER_TIMEOUT, 15000).
%% Long enough that no heartbeat reinstates a worker removed by the other
%% node during a test (heartbeats come every third of it).
-define(OPTS(Map), Map#{timeout => 60}).

delta_test_() ->
    {
        "couch_workers membership deltas",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            fun(#{dir := Dir}) ->
                {
                    foreach,
                    fun() -> #{dir => Dir, type => unique_type("md")} end,
                    fun(#{type := T}) -> clear_sink(T) end,
                    [
                        ?TDEF_FE(deltas_match_whole_reads_on_one_node, 60),
                        ?TDEF_FE(deltas_match_whole_reads_with_a_second_node, 60)
                    ]
                }
            end
        }
    }.

%% ---- tests ---------------------------------------------------------------

deltas_match_whole_reads_on_one_node(#{type := T}) ->
    Refs0 = maps:from_list([{id(I), reg(T, id(I), #{i => I})} || I <- lists:seq(1, 20)]),
    C0 = start_checks(T),
    %% One join, one leave.
    Refs1 = Refs0#{id(21) => reg(T, id(21), #{i => 21})},
    C1 = step_as_deltas(C0),
    ok = couch_workers:worker_unregister(maps:get(id(1), Refs1)),
    C2 = step_as_deltas(C1),
    %% New options: a leave and a join (folded into one entry when the
    %% watcher reads both at once).
    ok = couch_workers:worker_unregister(maps:get(id(2), Refs1)),
    Refs2 = Refs1#{id(2) => reg(T, id(2), #{i => 2, v => 2})},
    C3 = step_as_deltas(C2),
    %% 30 joins at once, from as many processes (this one owns the
    %% workers): several per message.
    Owner = self(),
    Batch = parallel([fun() -> {id(I), reg(T, id(I), #{i => I}, Owner)} end || I <- lists:seq(22, 51)]),
    C4 = step_as_deltas(C3),
    %% Everyone leaves at once: the last message is whole (#{}).
    Refs = maps:values(maps:merge(maps:remove(id(1), Refs2), maps:from_list(Batch))),
    parallel([fun() -> couch_workers:worker_unregister(R) end || R <- Refs]),
    last_step_whole(C4).

deltas_match_whole_reads_with_a_second_node(#{dir := Dir, type := T}) ->
    Peer = couch_workers_test_util:start_peer(Dir),
    try
        A1 = reg(T, <<"a1">>, #{v => 1}),
        ok = peer_do(Peer, T, [{join, id(I), #{i => I}} || I <- lists:seq(1, 10)]),
        C0 = start_checks(T),
        ok = peer_do(Peer, T, [{join, <<"b11">>, #{i => 11}}, {leave, id(3)}, {leave, id(4)}]),
        C1 = step_as_deltas(C0),
        %% B registers A's worker again with other options: in the store
        %% that is a join of a member, a delta entry with new options.
        ok = peer_do(Peer, T, [{join, <<"a1">>, #{v => 2}}]),
        C2 = step_as_deltas(C1),
        ?assertMatch({ok, _, #{<<"a1">> := #{<<"v">> := 2}}}, couch_workers:get_workers(T)),
        %% A's registration was replaced by B's incarnation: unregistering
        %% it removes nothing of B's (no change, so no delivery).
        ok = couch_workers:worker_unregister(A1),
        ?assertMatch({ok, _, #{<<"a1">> := #{<<"v">> := 2}}}, couch_workers:get_workers(T)),
        C3 = C2,
        Left = [id(I) || I <- lists:seq(1, 10), I =/= 3, I =/= 4] ++ [<<"b11">>, <<"a1">>],
        ok = peer_do(Peer, T, [{leave, Id} || Id <- Left]),
        last_step_whole(C3)
    after
        couch_workers_test_util:stop_peer(Peer)
    end.

%% ---- checks --------------------------------------------------------------

%% Starts the followers of T's membership: a NIF watch whose messages this
%% process applies itself, a message subscription and a callback
%% subscription; checks them against a whole read.
start_checks(T) ->
    Tag = make_ref(),
    {ok, Watch} = couch_workers_nif:membership_watch(T, Tag),
    set_sink(T, self()),
    C = #{
        type => T,
        tag => Tag,
        watch => Watch,
        vs => none,
        workers => none,
        sub => couch_workers:membership_subscribe(T, nil, self()),
        cb => couch_workers:membership_subscribe(T, couch_workers_test_cb, self())
    },
    {[changed], C1} = check(C),
    C1.

%% A step of changes, each smaller than the membership: deltas only.
step_as_deltas(C) ->
    {Kinds, C1} = check(C),
    ?assertEqual([delta], lists:usort(Kinds)),
    C1.

%% The step that empties the membership: its last message is whole.
last_step_whole(#{watch := Watch, sub := Sub, cb := Cb} = C) ->
    {Kinds, #{workers := Workers}} = check(C),
    ?assertEqual(changed, lists:last(Kinds)),
    ?assertEqual(#{}, Workers),
    ok = couch_workers_nif:membership_unwatch(Watch),
    ok = couch_workers:membership_unsubscribe(Sub),
    ok = couch_workers:membership_unsubscribe(Cb).

%% Reads the whole membership, follows every view of it up to that
%% versionstamp and checks they all equal it. Returns the kinds of the
%% watch messages that led there, and the followed state.
check(#{type := T} = C) ->
    {VS, Whole} = whole_read(T),
    {Kinds, C1} = follow_watch(C, VS, []),
    ?assertEqual(VS, maps:get(vs, C1)),
    ?assertEqual(Whole, maps:get(workers, C1)),
    ?assertEqual({VS, Whole}, follow_sub(C, VS)),
    ?assertEqual({VS, Whole}, follow_cb(C, VS)),
    ?assertEqual({ok, VS, Whole}, couch_workers:get_workers(T)),
    {Kinds, C1}.

%% The first message of a new watch: the whole member range, read at once.
whole_read(T) ->
    Tag = make_ref(),
    {ok, Watch} = couch_workers_nif:membership_watch(T, Tag),
    receive
        {couch_workers_membership_changed, Tag, T, VS, Workers} ->
            ok = couch_workers_nif:membership_unwatch(Watch),
            {VS, Workers}
    after 5000 -> error(no_whole_read)
    end.

%% Applies the watch's messages (in order, versionstamps increasing) until
%% its versionstamp reaches VS.
follow_watch(#{vs := Last} = C, VS, Kinds) when Last =/= none, Last >= VS ->
    {lists:reverse(Kinds), C};
follow_watch(#{tag := Tag, type := T, vs := Last, workers := Old} = C, VS, Kinds) ->
    receive
        {couch_workers_membership_changed, Tag, T, New, Workers} ->
            ?assert(Last =:= none orelse New > Last),
            follow_watch(C#{vs := New, workers := Workers}, VS, [changed | Kinds]);
        {couch_workers_membership_delta, Tag, T, New, Joined, Left} ->
            ?assertNotEqual(none, Last),
            ?assert(New > Last),
            JoinedIds = [Id || {Id, _} <- Joined],
            ?assertEqual([], [Id || Id <- Left, lists:member(Id, JoinedIds)]),
            Workers = maps:merge(maps:without(Left, Old), maps:from_list(Joined)),
            follow_watch(C#{vs := New, workers := Workers}, VS, [delta | Kinds])
    after 5000 -> error({no_watch_message_up_to, VS})
    end.

%% The message subscription's deliveries up to VS: the last one.
follow_sub(#{sub := Sub} = C, VS) ->
    receive
        {couch_workers_membership, _, Workers, New, Sub} when New >= VS -> {New, Workers};
        {couch_workers_membership, _, _, _, Sub} -> follow_sub(C, VS)
    after 5000 -> error({no_delivery_up_to, VS})
    end.

%% The callback subscription's calls up to VS: the last one.
follow_cb(#{cb := Cb, type := T} = C, VS) ->
    case recv_callback(couch_workers_test_cb, 5000) of
        {T, Workers, New, Cb} when New >= VS -> {New, Workers};
        {T, _, _, Cb} -> follow_cb(C, VS);
        timeout -> error({no_callback_up_to, VS})
    end.

%% ---- helpers -------------------------------------------------------------

id(I) -> iolist_to_binary(io_lib:format("w~3..0b", [I])).

reg(T, Id, Opts) ->
    reg(T, Id, Opts, self()).

reg(T, Id, Opts, Owner) ->
    Ref = couch_workers:worker_register(T, Id, ?OPTS(Opts), Owner),
    ?assert(is_reference(Ref)),
    Ref.

%% Runs the funs in as many processes at once; their results, in order.
parallel(Funs) ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {self(), F()} end) || F <- Funs],
    [
        receive
            {Pid, Result} -> Result
        end
     || Pid <- Pids
    ].

peer_do(#{peer := Peer}, T, Ops) ->
    peer:call(Peer, ?MODULE, peer_apply, [T, Ops], ?PEER_TIMEOUT).

%% Run on the peer: applies {join, Id, Opts} and {leave, Id} in order, in a
%% long-lived process of the peer that owns its registrations.
peer_apply(T, Ops) ->
    Holder =
        case whereis(cw_delta_holder) of
            undefined ->
                Pid = spawn(fun() -> holder(#{}) end),
                true = register(cw_delta_holder, Pid),
                Pid;
            Pid ->
                Pid
        end,
    Holder ! {apply, self(), T, Ops},
    receive
        {applied, Result} -> Result
    after 10000 -> {error, timeout}
    end.

holder(Refs) ->
    receive
        {apply, From, T, Ops} ->
            Refs1 = lists:foldl(fun(Op, Acc) -> holder_op(T, Op, Acc) end, Refs, Ops),
            From ! {applied, ok},
            holder(Refs1)
    end.

holder_op(T, {join, Id, Opts}, Refs) ->
    Ref = couch_workers:worker_register(T, Id, ?OPTS(Opts), self()),
    true = is_reference(Ref),
    Refs#{Id => Ref};
holder_op(_T, {leave, Id}, Refs) ->
    ok = couch_workers:worker_unregister(maps:get(Id, Refs)),
    maps:remove(Id, Refs).
