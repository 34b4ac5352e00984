%% @doc couch_workers:metrics/0,1: this node's counters move by exactly
%% what was done through it; latency summaries hold what was timed; the
%% Prometheus exposition parses line by line (a small parser of the text
%% format below) and says what metrics/0 says.
-module(couch_workers_metrics_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

-export([parse/1, peer_worker/3, peer_worker_running/3]).

-define(PEER_TIMEOUT, 15000).

metrics_test_() ->
    {
        "metrics on one node",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            fun(_) ->
                [
                    {"job and worker counters move by exactly what was done", ?_test(counters_are_exact())},
                    {"failed calls count nothing", ?_test(failed_calls_count_nothing())},
                    {"an owner's exit counts its running jobs as requeued, an unregister does not", ?_test(owner_exit_counts_requeued())},
                    {"fail (retried, failed), release, resubmit and remove/3 count exactly", ?_test(job_ends_count_exactly())},
                    {"jobs past their keep count as pruned once", ?_test(prunes_count())},
                    {"store counters move with the store's work", ?_test(store_counters_move())},
                    {"prometheus: every line parses, values match metrics/0", ?_test(prometheus_parses_and_matches())},
                    {"prometheus: label values escaped", ?_test(prometheus_escapes_labels())},
                    {"metrics/1 of an unknown format is badarg", ?_test(?assertError(badarg, couch_workers:metrics(json)))},
                    {"quantiles of the histogram are within a bucket of the truth", ?_test(quantiles_within_a_bucket())},
                    {"a killed metrics server restarts and counting goes on", ?_test(killed_server_restarts())}
                ]
            end
        }
    }.

reap_test_() ->
    couch_workers_test_util:peer_fixture(
        "metrics: reaps by this node's reaper",
        "mreap",
        [
            ?TDEF_FE(a_reap_of_a_killed_peers_worker_counts_once, 60),
            ?TDEF_FE(a_reap_counts_the_running_jobs_it_failed_over, 60),
            ?TDEF_FE(a_replaced_registration_counts_its_running_jobs, 60)
        ]
    ).

histogram_test_() ->
    [
        {"the parser refuses malformed lines", ?_test(parser_refuses_malformed())}
    ].

%% ---- tests ---------------------------------------------------------------

type_metrics(T) ->
    maps:get(T, maps:get(types, couch_workers:metrics()), undefined).

counters_are_exact() ->
    T = unique_type("mx"),
    ?assertEqual(undefined, type_metrics(T)),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    ok = couch_workers:job_add_many(T, [{<<"j3">>, #{}, #{}}, {<<"j4">>, #{}, #{}}, {<<"j5">>, #{}, #{}}]),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    {ok, J2} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J1, #{}),
    ok = couch_workers:job_cancel(T, <<"j4">>),
    ok = couch_workers:job_remove(T, <<"j5">>),
    ok = couch_workers:job_finish(J2, #{}),
    ok = couch_workers:worker_unregister(W),
    M = type_metrics(T),
    ?assertEqual(
        #{
            jobs_added => 5,
            jobs_accepted => 2,
            jobs_finished => 2,
            jobs_failed => 0,
            jobs_retried => 0,
            jobs_released => 0,
            jobs_resubmitted => 0,
            jobs_canceled => 1,
            jobs_removed => 1,
            jobs_requeued => 0,
            jobs_timed_out => 0,
            jobs_pruned => 0,
            workers_registered => 1,
            workers_unregistered => 1,
            workers_reaped => 0,
            heartbeat_failures => 0
        },
        maps:remove(latency, M)
    ),
    #{latency := #{add := Add, accept_wait := Acc, finish := Fin}} = M,
    %% Three add calls (one of them a batch of three), two accepts, two finishes.
    ?assertMatch(#{count := 3}, Add),
    ?assertMatch(#{count := 2}, Acc),
    ?assertMatch(#{count := 2}, Fin),
    [
        begin
            ?assert(P50 =< P99),
            ?assert(P99 =< Max),
            ?assert(Max =< Sum),
            %% Each call took some microseconds at least (a store commit).
            ?assert(Max > 0)
        end
     || #{p50_us := P50, p99_us := P99, max_us := Max, sum_us := Sum} <- [Add, Fin]
    ],
    %% An owner's exit is a removal too.
    Owner = spawn(fun() -> receive stop -> ok end end),
    W2 = couch_workers:worker_register(T, <<"w2">>, #{}, Owner),
    ?assert(is_reference(W2)),
    Owner ! stop,
    wait_for(fun() -> maps:get(workers_unregistered, type_metrics(T)) =:= 2 end, 5000),
    ?assertEqual(2, maps:get(workers_registered, type_metrics(T))).

%% Two jobs running for a worker whose owner exits: they fail over (a
%% death spends the attempt) and count as requeued, exactly two; a job
%% running for a worker that unregisters is released, not failed over,
%% and counts nothing.
owner_exit_counts_requeued() ->
    T = unique_type("mexit"),
    ok = couch_workers:job_add_many(T, [{<<"j1">>, #{}, #{}}, {<<"j2">>, #{}, #{}}, {<<"j3">>, #{}, #{}}]),
    Unreg = couch_workers:worker_register(T, <<"w0">>, #{}, self()),
    {ok, _} = couch_workers:job_accept(Unreg, #{}),
    ok = couch_workers:worker_unregister(Unreg),
    ?assertMatch(#{pending := 3, running := 0}, couch_workers:job_counts(T)),
    Owner = spawn(fun() -> receive stop -> ok end end),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, Owner),
    {ok, _} = couch_workers:job_accept(W, #{}),
    {ok, _} = couch_workers:job_accept(W, #{}),
    ?assertEqual(0, maps:get(jobs_requeued, type_metrics(T))),
    Owner ! stop,
    wait_for(fun() -> maps:get(workers_unregistered, type_metrics(T)) =:= 2 end, 5000),
    wait_for(fun() -> maps:get(jobs_requeued, type_metrics(T)) =:= 2 end, 5000),
    ?assertMatch(#{pending := 3, running := 0}, couch_workers:job_counts(T)),
    timer:sleep(300),
    ?assertEqual(2, maps:get(jobs_requeued, type_metrics(T))).

failed_calls_count_nothing() ->
    T = unique_type("mfail"),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Before = type_metrics(T),
    {error, already_exists} = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {error, {already_exists, [<<"j1">>]}} = couch_workers:job_add_many(T, [{<<"j1">>, #{}, #{}}, {<<"j9">>, #{}, #{}}]),
    {error, not_found} = couch_workers:job_cancel(T, <<"nope">>),
    {error, not_found} = couch_workers:job_remove(T, <<"nope">>),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_remove(T, <<"j1">>),
    {error, _} = couch_workers:job_finish(J, #{}),
    {error, not_found} = couch_workers:job_accept(W, #{}),
    ?assertError(badarg, couch_workers:job_add(T, not_an_id, #{}, #{})),
    ok = couch_workers:worker_unregister(W),
    After = type_metrics(T),
    %% Only the successful accept, remove, register and unregister moved.
    Moved = maps:filter(fun(K, V) -> K =/= latency andalso V =/= maps:get(K, Before) end, maps:remove(latency, After)),
    ?assertEqual(#{jobs_accepted => 1, jobs_removed => 1, workers_registered => 1, workers_unregistered => 1}, Moved),
    ?assertEqual(
        maps:get(count, maps:get(add, maps:get(latency, Before))), maps:get(count, maps:get(add, maps:get(latency, After)))
    ).

job_ends_count_exactly() ->
    T = unique_type("mends"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"retry">>, #{}, #{max_attempts => 2}),
    ok = couch_workers:job_add(T, <<"inf">>, #{}, #{max_attempts => infinity, priority => 1}),
    ok = couch_workers:job_add(T, <<"nope">>, #{}, #{priority => 2}),
    ok = couch_workers:job_add(T, <<"rel">>, #{}, #{priority => 3}),
    %% retried (attempts 1 < 2), then failed (attempts 2 of 2)
    {ok, #{id := <<"retry">>} = R1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(R1, #{<<"r">> => 1}, #{delay => 0}),
    {ok, #{id := <<"retry">>} = R2} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(R2, #{<<"r">> => 2}, #{delay => 0}),
    ?assertMatch({ok, #{state := failed}}, couch_workers:job_get(T, <<"retry">>)),
    %% infinity retries; retry => false (binary key too) fails at once
    {ok, #{id := <<"inf">>} = I1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(I1, #{}, #{delay => 60000}),
    ?assertMatch({ok, #{state := scheduled}}, couch_workers:job_get(T, <<"inf">>)),
    {ok, #{id := <<"nope">>} = N1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(N1, #{}, #{<<"retry">> => false}),
    ?assertMatch({ok, #{state := failed}}, couch_workers:job_get(T, <<"nope">>)),
    {ok, #{id := <<"rel">>} = L1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_release(L1, #{}),
    %% A handle used up counts nothing more.
    {error, not_owner} = couch_workers:job_release(L1, #{}),
    {error, not_owner} = couch_workers:job_fail(L1, #{}, #{}),
    ok = couch_workers:job_resubmit(T, <<"retry">>, #{}, #{}),
    ok = couch_workers:job_resubmit(T, <<"new">>, #{}, #{}),
    {error, changed} = couch_workers:job_resubmit(T, <<"new">>, #{}, #{if_vs => <<0:96>>}),
    {error, changed} = couch_workers:job_remove(T, <<"new">>, #{if_vs => <<0:96>>}),
    ok = couch_workers:job_remove(T, <<"new">>, #{}),
    ok = couch_workers:worker_unregister(W),
    M = type_metrics(T),
    ?assertMatch(
        #{jobs_retried := 2, jobs_failed := 2, jobs_released := 1, jobs_resubmitted := 2, jobs_removed := 1, jobs_accepted := 5},
        M
    ),
    #{latency := #{fail := Fail, release := Rel, resubmit := Resub}} = M,
    ?assertMatch({#{count := 4}, #{count := 1}, #{count := 2}}, {Fail, Rel, Resub}),
    ?assert(maps:get(max_us, Fail) > 0).

%% Every node runs a pruner; this one is the only node here.
prunes_count() ->
    T = unique_type("mprune"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add_many(T, [{<<"k1">>, #{}, #{keep => 0}}, {<<"k2">>, #{}, #{keep => 0}}, {<<"kept">>, #{}, #{}}]),
    [
        begin
            {ok, J} = couch_workers:job_accept(W, #{}),
            ok = couch_workers:job_finish(J, #{})
        end
     || _ <- [1, 2, 3]
    ],
    ok = couch_workers:worker_unregister(W),
    wait_for(fun() -> couch_workers:job_counts(T) =:= #{scheduled => 0, pending => 0, running => 0, finished => 1, canceled => 0, failed => 0} end, 10000),
    wait_for(fun() -> maps:get(jobs_pruned, type_metrics(T)) =:= 2 end, 5000),
    timer:sleep(1500),
    ?assertEqual(2, maps:get(jobs_pruned, type_metrics(T))),
    ?assertEqual(0, maps:get(jobs_removed, type_metrics(T))).

store_counters_move() ->
    T = unique_type("mstore"),
    #{store := #{transactions := Tx0}} = couch_workers:metrics(),
    [ok = couch_workers:job_add(T, integer_to_binary(I), #{}, #{}) || I <- lists:seq(1, 10)],
    #{store := #{transactions := Tx1, conflicts := C, retries := R, failures := F}} = couch_workers:metrics(),
    %% At least one attempt per add (heartbeats and the reaper add more).
    ?assert(Tx1 - Tx0 >= 10),
    ?assert(is_integer(C) andalso is_integer(R) andalso is_integer(F)).

prometheus_parses_and_matches() ->
    T = unique_type("mprom"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J, #{}),
    Text = iolist_to_binary(couch_workers:metrics(prometheus)),
    Samples = parse(Text),
    Node = atom_to_binary(node()),
    L = #{<<"node">> => Node, <<"type">> => T},
    ?assertEqual(1.0, sample(<<"couch_workers_jobs_finished_total">>, L, Samples)),
    ?assertEqual(1.0, sample(<<"couch_workers_jobs_added_total">>, L, Samples)),
    ?assertEqual(1.0, sample(<<"couch_workers_workers_registered_total">>, L, Samples)),
    ?assertEqual(1.0, sample(<<"couch_workers_job_finish_seconds_count">>, L, Samples)),
    #{latency := #{finish := #{max_us := MaxUs, p99_us := P99}}} = type_metrics(T),
    ?assertEqual(MaxUs / 1.0e6, sample(<<"couch_workers_job_finish_seconds_max">>, L, Samples)),
    ?assertEqual(P99 / 1.0e6, sample(<<"couch_workers_job_finish_seconds">>, L#{<<"quantile">> => <<"0.99">>}, Samples)),
    ?assert(sample(<<"couch_workers_store_transactions_total">>, #{<<"node">> => Node}, Samples) > 0),
    ok = couch_workers:worker_unregister(W).

prometheus_escapes_labels() ->
    T = <<"q\"b\\s\nl", 16#ff, (unique_type("esc"))/binary>>,
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Text = iolist_to_binary(couch_workers:metrics(prometheus)),
    Samples = parse(Text),
    %% The parser unescapes \" \\ \n; the byte that is no UTF-8 is \xff.
    Label = <<"q\"b\\s\nl\\xff", (binary:part(T, 8, byte_size(T) - 8))/binary>>,
    ?assertEqual(
        1.0, sample(<<"couch_workers_jobs_added_total">>, #{<<"node">> => atom_to_binary(node()), <<"type">> => Label}, Samples)
    ).

a_reap_of_a_killed_peers_worker_counts_once(#{peer := Peer, type := T} = Ctx) ->
    ok = peer:call(Peer, ?MODULE, peer_worker, [T, <<"b1">>, #{timeout => 1}], ?PEER_TIMEOUT),
    ?assertEqual(0, maps:get(workers_reaped, maps:get(T, maps:get(types, couch_workers:metrics()), #{workers_reaped => 0}))),
    couch_workers_test_util:kill_peer(Ctx),
    %% Only this node's reaper is left to reap it.
    wait_for(fun() -> couch_workers:workers(T) =:= [] end, 10000),
    wait_for(fun() -> (catch maps:get(workers_reaped, type_metrics(T))) =:= 1 end, 5000),
    timer:sleep(500),
    ?assertEqual(1, maps:get(workers_reaped, type_metrics(T))).

%% The peer's worker runs two jobs when the peer is killed: this node's
%% reaper fails them over (back to pending, attempts left) and counts
%% them, once.
a_reap_counts_the_running_jobs_it_failed_over(#{peer := Peer, type := T} = Ctx) ->
    ok = couch_workers:job_add_many(T, [{<<"j1">>, #{}, #{}}, {<<"j2">>, #{}, #{}}]),
    ok = peer:call(Peer, ?MODULE, peer_worker_running, [T, <<"b1">>, 2], ?PEER_TIMEOUT),
    ?assertMatch(#{running := 2}, couch_workers:job_counts(T)),
    couch_workers_test_util:kill_peer(Ctx),
    wait_for(fun() -> (catch maps:get(jobs_requeued, type_metrics(T))) =:= 2 end, 15000),
    ?assertMatch(#{running := 0, pending := 2}, couch_workers:job_counts(T)),
    ?assertEqual(1, maps:get(workers_reaped, type_metrics(T))),
    timer:sleep(500),
    ?assertEqual(2, maps:get(jobs_requeued, type_metrics(T))).

%% The peer's worker runs two jobs; this node registers the same id,
%% replacing it: the two jobs fail over in that registration's
%% transaction, and this node, which ran it, counts them (the peer never
%% unregistered: nothing is released).
a_replaced_registration_counts_its_running_jobs(#{peer := Peer, type := T}) ->
    ok = couch_workers:job_add_many(T, [{<<"j1">>, #{}, #{}}, {<<"j2">>, #{}, #{}}]),
    ok = peer:call(Peer, ?MODULE, peer_worker_running, [T, <<"b1">>, 2], ?PEER_TIMEOUT),
    ?assertMatch(#{running := 2}, couch_workers:job_counts(T)),
    W = couch_workers:worker_register(T, <<"b1">>, #{}, self()),
    ?assert(is_reference(W)),
    ?assertMatch(#{running := 0, pending := 2}, couch_workers:job_counts(T)),
    wait_for(fun() -> (catch maps:get(jobs_requeued, type_metrics(T))) =:= 2 end, 5000),
    timer:sleep(300),
    ?assertEqual(2, maps:get(jobs_requeued, type_metrics(T))),
    ?assertEqual(0, maps:get(workers_reaped, type_metrics(T))),
    ok = couch_workers:worker_unregister(W).

quantiles_within_a_bucket() ->
    rand:seed(exsss, {1, 2, 3}),
    Values = [trunc(math:exp(rand:uniform() * 20)) || _ <- lists:seq(1, 5000)],
    T = unique_type("mq"),
    %% Straight into the histogram of a fresh type.
    [couch_workers_metrics:observe(add, T, V) || V <- Values],
    #{p50_us := P50, p99_us := P99, max_us := Max, count := N, sum_us := Sum} =
        maps:get(add, maps:get(latency, type_metrics(T))),
    Sorted = lists:sort(Values),
    True = fun(Q) -> lists:nth(max(1, ceil(Q * length(Sorted))), Sorted) end,
    ?assertEqual({5000, lists:sum(Values), lists:max(Values)}, {N, Sum, Max}),
    [
        ?assert(Est >= True(Q) andalso Est =< True(Q) * 1.25 + 1)
     || {Q, Est} <- [{0.5, P50}, {0.99, P99}]
    ].

killed_server_restarts() ->
    Old = whereis(couch_workers_metrics),
    ?assertEqual({error, {bad_call, nonsense}}, gen_server:call(Old, nonsense)),
    exit(Old, kill),
    wait_for(fun() -> is_pid(whereis(couch_workers_metrics)) andalso whereis(couch_workers_metrics) =/= Old end, 5000),
    %% The counters start again from zero (a new table), and count.
    T = unique_type("mrestart"),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertMatch(#{jobs_added := 1}, type_metrics(T)).

parser_refuses_malformed() ->
    Good = <<"# HELP x_total A thing.\n# TYPE x_total counter\nx_total{a=\"b\"} 1\n">>,
    ?assertMatch([_], parse(Good)),
    Bad = [
        <<"x_total 1\n">>,                                         %% no TYPE before it
        <<"# TYPE x_total counter\nx_total{a=b} 1\n">>,            %% unquoted label value
        <<"# TYPE x_total counter\nx_total{a=\"b} 1\n">>,          %% unterminated
        <<"# TYPE x_total counter\nx_total{a=\"b\"} one\n">>,      %% not a number
        <<"# TYPE x_total counter\n9x_total 1\n">>,                %% bad name
        <<"# TYPE x_total counter\n# TYPE x_total counter\n">>,    %% TYPE twice
        <<"# TYPE x_total counter\ny_total 1\n">>,                 %% sample of another family
        <<"# TYPE x_total counter\nx_total 1">>                    %% no final newline
    ],
    [?assertError(_, parse(B)) || B <- Bad].

%% ---- run on the peer -----------------------------------------------------

peer_worker(Type, Id, Opts) ->
    Caller = self(),
    spawn(fun() ->
        W = couch_workers:worker_register(Type, Id, Opts, self()),
        Caller ! {registered, is_reference(W)},
        receive
            stop -> ok
        end
    end),
    receive
        {registered, true} -> ok
    after 10000 -> {error, timeout}
    end.

%% A worker (timeout 1 s) that accepts `N' jobs and keeps them running.
peer_worker_running(Type, Id, N) ->
    Caller = self(),
    spawn(fun() ->
        W = couch_workers:worker_register(Type, Id, #{timeout => 1}, self()),
        Got = [couch_workers:job_accept(W, #{timeout => 5000}) || _ <- lists:seq(1, N)],
        Caller ! {running, length([J || {ok, J} <- Got])},
        receive
            stop -> ok
        end
    end),
    receive
        {running, N} -> ok;
        {running, Other} -> {error, {running, Other}}
    after 20000 -> {error, timeout}
    end.

%% ---- a parser of the Prometheus text format (0.0.4) ----------------------------
%%
%% Checks every line: `# HELP name text', `# TYPE name kind' (once per
%% family, before its samples), other comments, blank lines, and samples
%% `name{label="value",...} number' whose name is the family's (or, for a
%% summary or histogram, its `_sum', `_count', `_bucket'). Fails with
%% `{bad_line, N, Line, Why}'. Returns `[{Name, #{Label => Value}, float()}]'.

parse(Text) ->
    case binary:last(Text) of
        $\n -> ok;
        _ -> erlang:error(no_final_newline)
    end,
    Lines = binary:split(Text, <<"\n">>, [global]),
    {Samples, _} = lists:foldl(
        fun({N, Line}, {Acc, Types}) ->
            try parse_line(Line, Types) of
                {sample, S} -> {[S | Acc], Types};
                {type, Name, Kind} -> {Acc, Types#{Name => Kind}};
                skip -> {Acc, Types}
            catch
                throw:Why -> erlang:error({bad_line, N, Line, Why})
            end
        end,
        {[], #{}},
        lists:zip(lists:seq(1, length(Lines)), Lines)
    ),
    lists:reverse(Samples).

parse_line(<<>>, _Types) ->
    skip;
parse_line(<<"# TYPE ", Rest/binary>>, Types) ->
    case binary:split(Rest, <<" ">>) of
        [Name, Kind] ->
            metric_name(Name),
            lists:member(Kind, [<<"counter">>, <<"gauge">>, <<"summary">>, <<"histogram">>, <<"untyped">>]) orelse
                throw(bad_kind),
            maps:is_key(Name, Types) andalso throw(type_twice),
            {type, Name, Kind};
        _ ->
            throw(bad_type_line)
    end;
parse_line(<<"# HELP ", Rest/binary>>, _Types) ->
    case binary:split(Rest, <<" ">>) of
        [Name, _Help] -> metric_name(Name), skip;
        _ -> throw(bad_help_line)
    end;
parse_line(<<"#", _/binary>>, _Types) ->
    skip;
parse_line(Line, Types) ->
    {Name, Rest} = take_name(Line, <<>>),
    metric_name(Name),
    family_of(Name, Types),
    {Labels, Rest1} =
        case Rest of
            <<"{", R/binary>> -> labels(R, #{});
            _ -> {#{}, Rest}
        end,
    case Rest1 of
        <<" ", Value/binary>> -> {sample, {Name, Labels, number(Value)}};
        _ -> throw(no_value)
    end.

take_name(<<C, Rest/binary>>, Acc) when C =/= ${, C =/= $\s -> take_name(Rest, <<Acc/binary, C>>);
take_name(Rest, Acc) -> {Acc, Rest}.

metric_name(<<C, Rest/binary>>) when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_; C =:= $: ->
    [ok = name_char(X) || <<X>> <= Rest],
    ok;
metric_name(_) ->
    throw(bad_name).

name_char(C) when C >= $a, C =< $z; C >= $A, C =< $Z; C >= $0, C =< $9; C =:= $_; C =:= $: -> ok;
name_char(_) -> throw(bad_name).

%% The sample's family must have been declared (TYPE) before it.
family_of(Name, Types) ->
    Candidates = [Name | [binary:part(Name, 0, byte_size(Name) - byte_size(S)) || S <- [<<"_sum">>, <<"_count">>, <<"_bucket">>], byte_size(Name) > byte_size(S), binary:longest_common_suffix([Name, S]) =:= byte_size(S)]],
    case [F || F <- Candidates, maps:is_key(F, Types)] of
        [Name | _] -> ok;
        [F | _] when F =/= Name ->
            lists:member(maps:get(F, Types), [<<"summary">>, <<"histogram">>]) orelse throw(suffix_of_a_plain_family),
            ok;
        [] -> throw(no_type_for_sample)
    end.

labels(<<"}", Rest/binary>>, Acc) ->
    {Acc, Rest};
labels(Bin, Acc) ->
    {Key, Rest} = label_name(Bin, <<>>),
    case Rest of
        <<"=\"", R/binary>> ->
            {Value, R1} = label_value(R, <<>>),
            Acc1 = Acc#{Key => Value},
            case R1 of
                <<",", R2/binary>> -> labels(R2, Acc1);
                <<"}", R2/binary>> -> {Acc1, R2};
                _ -> throw(bad_label_separator)
            end;
        _ ->
            throw(bad_label)
    end.

label_name(<<C, Rest/binary>>, Acc) when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_; (C >= $0 andalso C =< $9 andalso Acc =/= <<>>) ->
    label_name(Rest, <<Acc/binary, C>>);
label_name(_Rest, <<>>) ->
    throw(bad_label_name);
label_name(Rest, Acc) ->
    {Acc, Rest}.

label_value(<<"\\\\", Rest/binary>>, Acc) -> label_value(Rest, <<Acc/binary, "\\">>);
label_value(<<"\\\"", Rest/binary>>, Acc) -> label_value(Rest, <<Acc/binary, "\"">>);
label_value(<<"\\n", Rest/binary>>, Acc) -> label_value(Rest, <<Acc/binary, "\n">>);
label_value(<<"\\", _/binary>>, _Acc) -> throw(bad_escape);
label_value(<<"\"", Rest/binary>>, Acc) -> {Acc, Rest};
label_value(<<"\n", _/binary>>, _Acc) -> throw(raw_newline);
label_value(<<C, Rest/binary>>, Acc) -> label_value(Rest, <<Acc/binary, C>>);
label_value(<<>>, _Acc) -> throw(unterminated_label_value).

number(<<"+Inf">>) -> infinity;
number(<<"-Inf">>) -> neg_infinity;
number(<<"NaN">>) -> nan;
number(Bin) ->
    try binary_to_float(Bin) of
        F -> F
    catch
        error:badarg ->
            try float(binary_to_integer(Bin)) of
                F -> F
            catch
                error:badarg -> throw(bad_number)
            end
    end.

sample(Name, Labels, Samples) ->
    case [V || {N, L, V} <- Samples, N =:= Name, L =:= Labels] of
        [V] -> V;
        Other -> erlang:error({sample, Name, Labels, Other})
    end.
