%% @doc Isolation, at the Erlang API.
%%
%% couch_workers_jobs_tests already shows that the same job id in another
%% type is another job and that a worker does not take a pending job of
%% another type; couch_workers_workers_tests that the same worker id in
%% another type is another worker. This suite goes further:
%%
%% * names that look like the key space's own (`jobs', `pending',
%%   `active', `workers', `member', `health', `vs', `orphans',
%%   `couch_workers'), the empty binary, NUL bytes and fragments of the
%%   tuple encoding (`<<0>>', `<<0,255>>', `<<1,"jobs",0>>', ...), used
%%   at once as worker types, job types, worker ids and job ids: every
%%   get, count, membership and accept sees exactly its own;
%% * a worker of type A never takes (also not while it waits), updates or
%%   finishes a job of type B, even with a handle rewritten to name B's
%%   job of the same id run by a worker of the same id;
%% * a job id made of tuple-encoding fragments reads and writes only its
%%   own job.
-module(couch_workers_isolation_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

%% Names that look like each other and like the key space's names.
-define(NAMES, [
    <<"jobs">>,
    <<"pending">>,
    <<"active">>,
    <<"workers">>,
    <<"member">>,
    <<"health">>,
    <<"vs">>,
    <<"orphans">>,
    <<"couch_workers">>,
    <<>>,
    <<0>>,
    <<0, 0>>,
    <<0, 255>>,
    <<255>>,
    <<"a">>,
    <<"a", 0>>,
    <<"a", 0, "b">>,
    <<"a", 0, 255, "b">>,
    <<1, "jobs", 0>>,
    <<"jobs", 0, 1, "pending">>
]).

isolation_test_() ->
    {
        "isolation of types, ids and handles",
        {
            setup,
            %% A store of its own: the confusable names are global.
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            {
                foreach,
                fun setup/0,
                fun teardown/1,
                [
                    ?TDEF_FE(confusable_names_stay_in_their_own_keys, 60),
                    ?TDEF_FE(worker_of_type_a_never_takes_type_b_jobs, 30),
                    ?TDEF_FE(handle_of_type_a_cannot_touch_type_b_job, 30),
                    ?TDEF_FE(crafted_job_ids_read_and_write_only_their_own, 30)
                ]
            }
        }
    }.

setup() ->
    #{type => unique_type("iso")}.

teardown(_) ->
    ok.

%% ---- tests -------------------------------------------------------------------

confusable_names_stay_in_their_own_keys(#{}) ->
    Names = ?NAMES,
    N = length(Names),
    %% Every name is a worker type with a worker of every name, and a job
    %% type with a job of every name; each says where it belongs.
    Subs = [{T, couch_workers:membership_subscribe(T, nil, self())} || T <- Names],
    Workers = [
        {{T, W}, couch_workers:worker_register(T, W, #{<<"type">> => hex(T), <<"id">> => hex(W)}, self())}
     || T <- Names, W <- Names
    ],
    [?assert(is_reference(R)) || {_, R} <- Workers],
    ?assertEqual(N * N, length(lists:usort([R || {_, R} <- Workers]))),
    %% Before any job: no count anywhere, although the workers' keys exist.
    [?assertEqual(0, couch_workers:job_pending_count(T)) || T <- Names],
    [
        ok = couch_workers:job_add_many(T, [{J, #{<<"type">> => hex(T), <<"id">> => hex(J)}, #{}} || J <- Names])
     || T <- Names
    ],
    %% Each count, each job, each membership: exactly its own.
    [?assertEqual(N, couch_workers:job_pending_count(T)) || T <- Names],
    [
        ?assertMatch(
            {ok, #{type := T, id := J, state := pending, info := #{<<"type">> := HT, <<"id">> := HJ}}},
            couch_workers:job_get(T, J)
        )
     || T <- Names, J <- Names, HT <- [hex(T)], HJ <- [hex(J)]
    ],
    Want = fun(T) -> maps:from_list([{W, #{<<"type">> => hex(T), <<"id">> => hex(W)}} || W <- Names]) end,
    [
        wait_for(
            fun() ->
                case couch_workers:get_workers(T) of
                    {ok, _, Got} -> Got =:= Want(T);
                    _ -> false
                end
            end,
            10000
        )
     || T <- Names
    ],
    %% Every worker takes one job, of its own type only; each job once.
    Taken = [
        begin
            {ok, #{type := T1, id := J, worker := W1, info := #{<<"type">> := HT}} = H} =
                couch_workers:job_accept(maps:get({T, W}, maps:from_list(Workers)), #{}),
            ?assertEqual({T, W, hex(T)}, {T1, W1, HT}),
            ok = couch_workers:job_finish(H, #{<<"by">> => hex(W)}),
            {T, J}
        end
     || T <- Names, W <- Names
    ],
    ?assertEqual(N * N, length(lists:usort(Taken))),
    [?assertEqual(0, couch_workers:job_pending_count(T)) || T <- Names],
    [
        ?assertMatch({ok, #{state := finished, info := #{<<"type">> := HT}}}, couch_workers:job_get(T, J))
     || T <- Names, J <- Names, HT <- [hex(T)]
    ],
    %% Removing one type's jobs, or unregistering one type's workers,
    %% leaves every other type as it was.
    [X | Others] = Names,
    [ok = couch_workers:job_remove(X, J) || J <- Names],
    [?assertEqual({error, not_found}, couch_workers:job_get(X, J)) || J <- Names],
    [?assertMatch({ok, #{type := T, id := J, state := finished}}, couch_workers:job_get(T, J)) || T <- Others, J <- Names],
    [ok = couch_workers:worker_unregister(R) || {{T, _}, R} <- Workers, T =:= X],
    wait_for(fun() -> element(3, couch_workers:get_workers(X)) =:= #{} end, 10000),
    [?assertEqual(Want(T), element(3, couch_workers:get_workers(T))) || T <- Others],
    %% Clean up: the names are global to this store.
    [ok = couch_workers:worker_unregister(R) || {{T, _}, R} <- Workers, T =/= X],
    [ok = couch_workers:job_remove(T, J) || T <- Others, J <- Names],
    [ok = couch_workers:membership_unsubscribe(S) || {_, S} <- Subs],
    flush_membership().

worker_of_type_a_never_takes_type_b_jobs(#{type := A}) ->
    %% B: types whose names start like A's, or that A's name starts like.
    Bs = [<<A/binary, 0>>, <<A/binary, 0, 1>>, <<A/binary, "x">>, binary:part(A, 0, byte_size(A) - 1)],
    W = couch_workers:worker_register(A, <<"w">>, #{}, self()),
    [ok = couch_workers:job_add(B, <<"j">>, #{}, #{priority => -100}) || B <- Bs],
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    %% Waiting: a job of B added meanwhile does not wake it for B's job.
    Self = self(),
    Waiter = spawn_link(fun() -> Self ! {accepted, couch_workers:job_accept(W, #{timeout => 500})} end),
    timer:sleep(100),
    [ok = couch_workers:job_add(B, <<"j2">>, #{}, #{}) || B <- Bs],
    receive
        {accepted, R} -> ?assertEqual({error, not_found}, R)
    after 5000 -> error(accept_timeout)
    end,
    unlink(Waiter),
    [?assertEqual(2, couch_workers:job_pending_count(B)) || B <- Bs],
    [?assertMatch({ok, #{state := pending, attempts := 0}}, couch_workers:job_get(B, J)) || B <- Bs, J <- [<<"j">>, <<"j2">>]],
    %% A job of A itself is taken at once.
    ok = couch_workers:job_add(A, <<"j">>, #{}, #{}),
    ?assertMatch({ok, #{type := A, id := <<"j">>}}, couch_workers:job_accept(W, #{})),
    ok = couch_workers:worker_unregister(W),
    [ok = couch_workers:job_remove(B, J) || B <- Bs, J <- [<<"j">>, <<"j2">>]],
    ok = couch_workers:job_remove(A, <<"j">>).

handle_of_type_a_cannot_touch_type_b_job(#{type := A}) ->
    B = <<A/binary, 0>>,
    %% The same worker id and the same job id in both types, each running.
    WA = couch_workers:worker_register(A, <<"w">>, #{}, self()),
    WB = couch_workers:worker_register(B, <<"w">>, #{}, self()),
    ok = couch_workers:job_add(A, <<"j">>, #{<<"of">> => <<"A">>}, #{}),
    ok = couch_workers:job_add(B, <<"j">>, #{<<"of">> => <<"B">>}, #{}),
    {ok, HA} = couch_workers:job_accept(WA, #{}),
    {ok, HB} = couch_workers:job_accept(WB, #{}),
    %% A's handle rewritten to name B's job (type), with B's other fields.
    Forged = [
        HA#{type := B},
        HA#{type := B, info := maps:get(info, HB), vs := maps:get(vs, HB)},
        HB#{token := maps:get(token, HA)}
    ],
    [
        begin
            ?assertEqual({error, not_owner}, couch_workers:job_update(F, #{<<"of">> => <<"forged">>})),
            ?assertEqual({error, not_owner}, couch_workers:job_finish(F, #{<<"by">> => <<"forged">>}))
        end
     || F <- Forged
    ],
    %% B's job is untouched, and B's own handle still works.
    ?assertMatch({ok, #{state := running, worker := <<"w">>, info := #{<<"of">> := <<"B">>}, result := null}}, couch_workers:job_get(B, <<"j">>)),
    %% The same against a pending and a missing job of B.
    ok = couch_workers:job_finish(HB, #{<<"by">> => <<"B">>}),
    ok = couch_workers:job_add(B, <<"p">>, #{}, #{}),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(HA#{type := B, id := <<"p">>}, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_finish(HA#{type := B, id := <<"missing">>}, #{})),
    ?assertMatch({ok, #{state := pending, attempts := 0}}, couch_workers:job_get(B, <<"p">>)),
    ?assertMatch({ok, #{state := finished, result := #{<<"by">> := <<"B">>}}}, couch_workers:job_get(B, <<"j">>)),
    %% A worker of A cannot accept for B's worker either: accept takes the
    %% worker's own type from its registration, never from the caller.
    ?assertEqual({error, not_found}, couch_workers:job_accept(WA, #{})),
    ?assertEqual(1, couch_workers:job_pending_count(B)),
    %% And A's handle still does A's job.
    ?assertEqual(ok, couch_workers:job_finish(HA, #{<<"by">> => <<"A">>})),
    ?assertMatch({ok, #{state := finished, info := #{<<"of">> := <<"A">>}}}, couch_workers:job_get(A, <<"j">>)),
    [ok = couch_workers:worker_unregister(R) || R <- [WA, WB]],
    [ok = couch_workers:job_remove(T, J) || {T, J} <- [{A, <<"j">>}, {B, <<"j">>}, {B, <<"p">>}]].

crafted_job_ids_read_and_write_only_their_own(#{type := A}) ->
    B = <<"b">>,
    %% Ids that contain pieces of the tuple encoding of other keys: the
    %% end of a byte string (0x00), an escaped NUL (0x00 0xFF), a new
    %% byte-string element (0x01), the names of other types and subspaces.
    Ids = [
        <<>>,
        <<0>>,
        <<0, 255>>,
        <<0, 1, B/binary, 0>>,
        <<0, 1, B/binary, 0, 1, "j", 0>>,
        <<"j", 0, 1, "jobs", 0>>,
        <<A/binary, 0, 1, "j">>,
        <<1, "couch_workers", 0, 1, "jobs", 0>>,
        <<"j">>
    ],
    Types = [A, B, <<A/binary, 0>>, <<A/binary, 0, 1, "j">>],
    [ok = couch_workers:job_add(T, Id, #{<<"t">> => hex(T), <<"i">> => hex(Id)}, #{}) || T <- Types, Id <- Ids],
    Check = fun() ->
        [
            ?assertMatch(
                {ok, #{type := T, id := Id, info := #{<<"t">> := HT, <<"i">> := HI}}},
                couch_workers:job_get(T, Id)
            )
         || T <- Types, Id <- Ids, HT <- [hex(T)], HI <- [hex(Id)]
        ],
        [?assertEqual(length(Ids), couch_workers:job_pending_count(T)) || T <- Types]
    end,
    Check(),
    %% Adding any of them again, in any type, is `already_exists': no id
    %% lands on another's key...
    [?assertEqual({error, already_exists}, couch_workers:job_add(T, Id, #{}, #{})) || T <- Types, Id <- Ids],
    %% ...and an id made of another type and id together is not that job.
    ?assertEqual({error, not_found}, couch_workers:job_get(A, <<0, 1, "b", 0, 1, "j">>)),
    ?assertEqual({error, not_found}, couch_workers:job_get(<<A/binary, 0, 1, "b">>, <<"j">>)),
    %% Removing and canceling through one (type, id) touches nothing else.
    [T0 | _] = Types,
    [Id0, Id1 | _] = Ids,
    ok = couch_workers:job_remove(T0, Id0),
    ok = couch_workers:job_cancel(T0, Id1),
    [
        ?assertMatch({ok, #{state := pending}}, couch_workers:job_get(T, Id))
     || T <- Types, Id <- Ids, {T, Id} =/= {T0, Id0}, {T, Id} =/= {T0, Id1}
    ],
    ?assertEqual({error, not_found}, couch_workers:job_get(T0, Id0)),
    ?assertMatch({ok, #{state := canceled}}, couch_workers:job_get(T0, Id1)),
    ?assertEqual(length(Ids) - 2, couch_workers:job_pending_count(T0)),
    [?assertEqual(length(Ids), couch_workers:job_pending_count(T)) || T <- tl(Types)],
    %% Workers of each type take exactly their own, all of them.
    [
        begin
            W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
            Got = accept_all(W, []),
            ?assertEqual(lists:sort([Id || Id <- Ids, T =/= T0 orelse (Id =/= Id0 andalso Id =/= Id1)]), lists:sort(Got)),
            ok = couch_workers:worker_unregister(W)
        end
     || T <- Types
    ],
    [couch_workers:job_remove(T, Id) || T <- Types, Id <- Ids].

%% ---- helpers -------------------------------------------------------------------

%% Accepts (no wait) and finishes until none is left; checks each job is
%% of the worker's type (its info says so); returns the ids.
accept_all(W, Acc) ->
    case couch_workers:job_accept(W, #{}) of
        {ok, #{type := T, id := Id, info := #{<<"t">> := HT}} = H} ->
            ?assertEqual(hex(T), HT),
            ok = couch_workers:job_finish(H, #{}),
            accept_all(W, [Id | Acc]);
        {error, not_found} ->
            Acc
    end.

%% A name as JSON can hold it (names may be any bytes).
hex(Bin) ->
    binary:encode_hex(Bin).

flush_membership() ->
    receive
        {couch_workers_membership, _, _, _, _} -> flush_membership()
    after 0 -> ok
    end.
