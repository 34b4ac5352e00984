%% @doc The schedulers stay free (issue 6, part 4): no NIF call of
%% couch_workers holds a normal scheduler for 2 ms or more.
%%
%% A small workload of every call (register/unregister, membership
%% subscribe and deliveries, job add/add_many, get, accept, update,
%% finish, subscribe, remove) runs in a process of its own, twice:
%%
%% * `ordinary': terms of the sizes the benchmarks and CouchDB use, and
%%   somewhat bigger (a 50 KB binary, a map of 200 keys, a list of 1,000
%%   elements, a nested map);
%% * `size_limit': terms up to the value limit (about 100 KB of JSON) in
%%   the shapes that cost most to convert: one big binary, 8,000 map keys,
%%   7,500 strings, 49,000 list elements, and one term over the limit.
%%
%% While it runs,
%%
%% * `erlang:system_monitor(Collector, [{long_schedule, 2}])' reports
%%   every process that ran 2 ms or more without being scheduled out, as
%%   `{monitor, Pid, long_schedule, [{timeout, Ms}, {in, Loc}, {out,
%%   Loc}]}' (the collector stamps each with the time it arrived);
%% * every call of a couch_workers_nif NIF, in any process, is traced
%%   (`call' with `return_trace', `arity', `monotonic_timestamp'), which
%%   gives each NIF call's pid, start and end.
%%
%% Attribution. `in'/`out' are where the process was when it was
%% scheduled in and out. A NIF does not yield, so a long NIF call is
%% reported at the Erlang code around it (`out' is typically the
%% `receive' of `couch_workers_nif:wait/2' right after the call), not at
%% the NIF itself (checked with a C NIF that spins: in =
%% `undefined'/caller, out = the caller's next `receive'). So a message is
%% counted as caused by a NIF when either
%%
%%   (a) its `in' or `out' names a NIF of couch_workers_nif (not wait/2 or
%%       the other Erlang functions of that module), or
%%   (b) the same pid made a traced call of a NIF that runs on the normal
%%       schedulers (all but the DirtyCpu NIFs: `job_add_many/3' and the
%%       `_dirty' twins) that took 1 ms or more and lies within the
%%       reported interval [arrival - timeout - 5 ms, arrival + 5 ms].
%%
%% Every other message is printed and not counted (its pid's registered
%% name or initial call, in/out: the code server, the test's own code,
%% a dirty NIF, the OS taking the CPU away from a scheduler thread). A
%% control process that only runs short Erlang loops during the workload
%% shows that noise: its messages are printed apart. The slowest traced
%% call of each NIF is printed too.
%%
%% Each workload runs up to twice: it passes when a round has no message
%% caused by a NIF. A NIF that is slow is slow every time (the shapes are
%% fixed), so a real fault fails both rounds; a one-off stall of the OS
%% does not fail the test.
%%
%% `size_limit' failed before issue 6 was fixed: `job_add/5',
%% `job_update/3', `job_finish/3' and `worker_register/4' converted their
%% term to JSON on the calling (normal) scheduler, bounded by the value
%% limit, not by time: 5-11 ms for the shapes above. Now they convert at
%% most a budget of terms there and hand bigger ones to their DirtyCpu
%% `_dirty' twins (`couch_workers_nif:budgeted/2', the NIF crate's
%% `json.rs').
-module(couch_workers_sched_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

-export([terms/1, workload/2]).

-define(LONG_MS, 2).
%% A NIF call this long is a suspect for (b).
-define(SUSPECT_US, 1000).
-define(SLACK_US, 5000).
-define(ROUNDS, 3).
%% NIFs declared `schedule = "DirtyCpu"' (they leave the normal schedulers).
-define(DIRTY_NIFS, [
    {job_add_many, 3}, {worker_register_dirty, 4}, {job_add_dirty, 5}, {job_update_dirty, 3}, {job_finish_dirty, 3}
]).

sched_test_() ->
    {
        "long_schedule (2 ms) during workloads: none caused by a NIF call",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            fun(_) ->
                [
                    {"ordinary terms", {timeout, 120, ?_test(no_long_schedule_from_nifs(ordinary))}},
                    {"terms up to the size limits", {timeout, 120, ?_test(no_long_schedule_from_nifs(size_limit))}}
                ]
            end
        }
    }.

no_long_schedule_from_nifs(Kind) ->
    run_rounds(Kind, terms(Kind), 1, all).

%% A NIF fails the test only when it is implicated in every round: on a
%% loaded 2-core machine the OS can preempt a scheduler thread in the
%% middle of any cheap NIF call (seen: a 3 ms `job_get/3', which only
%% checks two binaries and spawns a task), while a NIF that really runs
%% long does so every time it gets the same terms.
run_rounds(Kind, Terms, Round, Suspects0) ->
    #{nif := Nif} = Figures = measure(Terms, unique_type("sched")),
    report(Kind, Round, Figures),
    Suspects =
        case Suspects0 of
            all -> implicated(Nif);
            _ -> ordsets:intersection(Suspects0, implicated(Nif))
        end,
    case Suspects of
        [] -> ok;
        _ when Round < ?ROUNDS -> run_rounds(Kind, Terms, Round + 1, Suspects);
        _ -> ?assertEqual([], {Suspects, Nif})
    end.

%% The NIFs (name and arity) a round's long_schedule messages point at:
%% the traced long NIF calls, or else the NIF named where the process was
%% scheduled out or in.
implicated(Nif) ->
    ordsets:from_list(lists:append([implicated_by(Info) || {nif, Info} <- Nif])).

implicated_by(#{nif_calls := [_ | _] = Calls}) ->
    [{N, A} || {N, A, _Us} <- Calls];
implicated_by(Info) ->
    [{F, A} || {couch_workers_nif, F, A} <- [maps:get(in, Info, none), maps:get(out, Info, none)]].

%% ---- the workload ------------------------------------------------------------

%% Built before the measurement, so that making them is not measured.
terms(ordinary) ->
    #{
        infos => [
            {small, #{<<"n">> => 1}},
            {bin50k, #{<<"bin">> => binary:copy(<<"b">>, 50000)}},
            {map200, maps:from_list([{integer_to_binary(I), I} || I <- lists:seq(1, 200)])},
            {list1000, #{<<"list">> => lists:seq(1, 1000)}},
            {nested, lists:foldl(fun(I, A) -> #{<<"in">> => A, <<"i">> => I, <<"s">> => <<"text">>} end, #{}, lists:seq(1, 40))}
        ],
        too_large => #{<<"bin">> => binary:copy(<<"b">>, 100001)}
    };
terms(size_limit) ->
    #{
        %% name => term, each under the value limit once encoded
        infos => [
            {small, #{<<"n">> => 1}},
            {bin99k, #{<<"bin">> => binary:copy(<<"b">>, 99000)}},
            {map8k, maps:from_list([{integer_to_binary(I), I} || I <- lists:seq(1, 8000)])},
            {strs7k, #{<<"strs">> => [<<"abcdefghij">> || _ <- lists:seq(1, 7500)]}},
            {list49k, #{<<"list">> => lists:duplicate(49000, 0)}}
        ],
        %% and one over it, refused (as cheaply as a legal one)
        too_large => #{<<"list">> => lists:duplicate(1000000, 0)}
    }.

workload(#{infos := Infos, too_large := TooLarge}, T) ->
    Self = self(),
    %% Workers with big options, registered and unregistered; their
    %% membership (big maps) delivered to a subscriber.
    Sub = couch_workers:membership_subscribe(T, nil, self()),
    [
        begin
            R = couch_workers:worker_register(T, atom_to_binary(Name), Info, self()),
            true = is_reference(R),
            ok = couch_workers:worker_unregister(R)
        end
     || {Name, Info} <- Infos
    ],
    {error, value_too_large} = couch_workers:worker_register(T, <<"huge">>, TooLarge, self()),
    W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    %% Jobs with big infos, one by one and in a batch.
    [ok = couch_workers:job_add(T, <<"one-", (atom_to_binary(Name))/binary>>, Info, #{}) || {Name, Info} <- Infos],
    {error, value_too_large} = couch_workers:job_add(T, <<"huge">>, TooLarge, #{}),
    ok = couch_workers:job_add_many(T, [{<<"many-", (atom_to_binary(Name))/binary>>, Info, #{}} || {Name, Info} <- Infos]),
    %% Read back (big replies).
    [{ok, _} = couch_workers:job_get(T, <<"one-", (atom_to_binary(Name))/binary>>) || {Name, _} <- Infos],
    %% Accept each, update with a big info, finish with a big result
    %% (small info first: a record holds info and result).
    Handles = [begin {ok, H} = couch_workers:job_accept(W, #{}), H end || _ <- lists:seq(1, 2 * length(Infos))],
    lists:foreach(
        fun({H, {_, Info}}) ->
            {ok, H1} = couch_workers:job_update(H, Info),
            {error, value_too_large} = couch_workers:job_update(H1, TooLarge),
            {ok, H2} = couch_workers:job_update(H1, #{}),
            ok = couch_workers:job_finish(H2, Info)
        end,
        lists:zip(Handles, Infos ++ Infos)
    ),
    %% Job subscriptions of big jobs, then removal.
    [
        begin
            Id = <<"one-", (atom_to_binary(Name))/binary>>,
            {ok, S, _} = couch_workers:job_subscribe(T, Id, self()),
            ok = couch_workers:job_remove(T, Id),
            receive
                {couch_workers_job, S, removed} -> ok
            after 5000 -> error({no_removed, Id})
            end
        end
     || {Name, _} <- Infos
    ],
    [ok = couch_workers:job_remove(T, <<"many-", (atom_to_binary(Name))/binary>>) || {Name, _} <- Infos],
    ok = couch_workers:worker_unregister(W),
    ok = couch_workers:membership_unsubscribe(Sub),
    Self.

%% ---- measuring -----------------------------------------------------------------

measure(Terms, T) ->
    Collector = spawn_link(fun() -> collect([]) end),
    Tracer = spawn_link(fun() -> collect([]) end),
    Previous = erlang:system_monitor(Collector, [{long_schedule, ?LONG_MS}]),
    Nifs = nif_functions(),
    [erlang:trace_pattern({couch_workers_nif, F, A}, [{'_', [], [{return_trace}]}], [local]) || {F, A} <- Nifs],
    _ = erlang:trace(all, true, [call, arity, monotonic_timestamp, {tracer, Tracer}]),
    Control = spawn_link(fun() -> control_loop(0) end),
    Self = self(),
    {Worker, Mon} = spawn_monitor(fun() -> Self ! {workload_done, self(), workload(Terms, T)} end),
    receive
        {workload_done, Worker, _} -> ok;
        {'DOWN', Mon, process, Worker, Reason} -> error({workload_failed, Reason})
    after 60000 -> error(workload_timeout)
    end,
    unlink(Control),
    exit(Control, kill),
    _ = erlang:trace(all, false, [call, arity, monotonic_timestamp, {tracer, Tracer}]),
    erlang:trace_pattern({couch_workers_nif, '_', '_'}, false, [local]),
    restore_monitor(Previous),
    %% Messages still on their way.
    timer:sleep(100),
    Longs = dump(Collector),
    Trace = dump(Tracer),
    Calls = nif_calls(Trace),
    Classified = [classify(L, Calls, Worker, Control) || L <- Longs],
    #{
        longs => Classified,
        nif => [C || {nif, _} = C <- Classified],
        calls => Calls,
        workload => Worker
    }.

%% The NIFs of couch_workers_nif (its Erlang functions excluded).
nif_functions() ->
    Erlang = [{init, 0}, {lib_path, 0}, {wait, 2}, {budgeted, 2}, {module_info, 0}, {module_info, 1}],
    [FA || FA <- couch_workers_nif:module_info(exports), not lists:member(FA, Erlang)].

restore_monitor(undefined) ->
    erlang:system_monitor(undefined);
restore_monitor({Pid, Opts}) ->
    erlang:system_monitor(Pid, Opts).

collect(Acc) ->
    receive
        {dump, From} ->
            From ! {dumped, self(), lists:reverse(Acc)};
        Msg ->
            collect([{erlang:monotonic_time(microsecond), Msg} | Acc])
    end.

dump(Pid) ->
    Pid ! {dump, self()},
    receive
        {dumped, Pid, Msgs} -> Msgs
    after 10000 -> error({dump_timeout, Pid})
    end.

%% Short bursts of pure Erlang, to see what the machine does to a process
%% that never calls a NIF.
control_loop(N) ->
    _ = lists:sum(lists:seq(1, 200)),
    receive
    after 1 -> control_loop(N + 1)
    end.

%% Pairs each traced NIF call with its return: [{Pid, {F, A}, StartUs, EndUs}].
nif_calls(Trace) ->
    {Calls, _Open} = lists:foldl(
        fun
            ({_, {trace_ts, Pid, call, {couch_workers_nif, F, A}, Ts}}, {Done, Open}) ->
                {Done, maps:put(Pid, {{F, A}, us(Ts)}, Open)};
            ({_, {trace_ts, Pid, return_from, {couch_workers_nif, F, A}, _Ret, Ts}}, {Done, Open}) ->
                case maps:take(Pid, Open) of
                    {{{F, A}, Start}, Open1} -> {[{Pid, {F, A}, Start, us(Ts)} | Done], Open1};
                    _ -> {Done, Open}
                end;
            (_, Acc) ->
                Acc
        end,
        {[], #{}},
        Trace
    ),
    lists:reverse(Calls).

us(Ts) ->
    erlang:convert_time_unit(Ts, native, microsecond).

classify({Arrived, {monitor, Pid, long_schedule, Info}}, Calls, Worker, Control) ->
    Ms = proplists:get_value(timeout, Info),
    In = proplists:get_value(in, Info),
    Out = proplists:get_value(out, Info),
    Who = who(Pid, Worker, Control),
    Named = names_nif(In) orelse names_nif(Out),
    From = Arrived - Ms * 1000 - ?SLACK_US,
    Until = Arrived + ?SLACK_US,
    Overlapping = [
        {F, A, End - Start}
     || {P, {F, A}, Start, End} <- Calls,
        P =:= Pid,
        not lists:member({F, A}, ?DIRTY_NIFS),
        End - Start >= ?SUSPECT_US,
        End >= From,
        Start =< Until
    ],
    Entry = #{who => Who, ms => Ms, in => In, out => Out, nif_calls => Overlapping},
    case Named orelse Overlapping =/= [] of
        true -> {nif, Entry};
        false when Who =:= control -> {noise, Entry};
        false -> {other, Entry}
    end;
classify({_, Other}, _Calls, _Worker, _Control) ->
    {other, #{who => unknown, msg => Other}}.

names_nif({couch_workers_nif, F, A}) ->
    lists:member({F, A}, nif_functions());
names_nif(_) ->
    false.

who(Pid, Worker, _Control) when Pid =:= Worker -> workload;
who(Pid, _Worker, Control) when Pid =:= Control -> control;
who(Pid, _Worker, _Control) when is_pid(Pid) ->
    case erlang:process_info(Pid, [registered_name, initial_call]) of
        [{registered_name, Name}, _] when is_atom(Name) -> Name;
        [_, {initial_call, Call}] -> {initial_call, Call};
        undefined -> {exited, Pid}
    end;
who(Port, _Worker, _Control) ->
    {port, Port}.

report(Kind, Round, #{longs := Longs, nif := Nif, calls := Calls}) ->
    ByNif = lists:foldl(
        fun({_, FA, S, E}, M) -> maps:update_with(FA, fun({N, Max}) -> {N + 1, max(Max, E - S)} end, {1, E - S}, M) end,
        #{},
        Calls
    ),
    Slowest = lists:reverse(lists:keysort(2, [{FA, Max, N} || {FA, {N, Max}} <- maps:to_list(ByNif)])),
    io:format(
        standard_error,
        "~n    ~s terms, round ~b: ~b NIF calls traced; slowest per NIF (us, calls): ~w~n"
        "    long_schedule messages (>= ~b ms): ~b; caused by a NIF call: ~b; control-process noise: ~b~n",
        [
            Kind,
            Round,
            length(Calls),
            [{F, A, Max, N} || {{F, A}, Max, N} <- Slowest],
            ?LONG_MS,
            length(Longs),
            length(Nif),
            length([x || {noise, _} <- Longs])
        ]
    ),
    [io:format(standard_error, "      ~p: ~0p~n", [Class, E]) || {Class, E} <- Longs],
    ok.
