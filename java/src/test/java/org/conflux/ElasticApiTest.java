package org.conflux;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The elastic calls' Java surface on the MPI world (not elastic): options checked by name, the
 * membership-change status mapped, and a clear refusal where the context cannot re-form. The
 * elastic worlds themselves run in tests/elastic_examples (cfxrun --elastic).
 */
@TestMethodOrder(MethodOrderer.MethodName.class)
class ElasticApiTest extends OnSharedContext {

    @Test
    void a01_membershipChangedMapsToItsExceptionAndIsAWorldChange() {
        RuntimeException e = ConfluxException.of(Status.MEMBERSHIP_CHANGED.code, "member 2 left");
        MembershipChangedException m = assertInstanceOf(MembershipChangedException.class, e);
        assertEquals(Status.MEMBERSHIP_CHANGED, m.status());
        assertEquals("MEMBERSHIP_CHANGED", m.statusName());
        assertEquals("member 2 left", m.getMessage());
        assertTrue(m.worldChanged());
        assertTrue(((ConfluxException) ConfluxException.of(Status.PEER_LOST.code, "x")).worldChanged());
        assertTrue(((ConfluxException) ConfluxException.of(Status.SHUT_DOWN.code, "x")).worldChanged());
        assertTrue(((ConfluxException) ConfluxException.of(Status.TRANSPORT.code, "x")).worldChanged());
        assertFalse(((ConfluxException) ConfluxException.of(Status.MISMATCH.code, "x")).worldChanged());
        assertFalse(((ConfluxException) ConfluxException.of(Status.STALL.code, "x")).worldChanged());
    }

    @Test
    void a02_badReformOptionsAreNamed() {
        IllegalArgumentException unknown = assertThrows(IllegalArgumentException.class,
                () -> cfx.reform(new Conflux.ReformOptions().set("min_sise", 2)));
        assertTrue(unknown.getMessage().contains("unknown option 'min_sise' (known: min_size max_size timeout_s settle_s)"),
                unknown.getMessage());
        IllegalArgumentException negative = assertThrows(IllegalArgumentException.class,
                () -> cfx.reform(new Conflux.ReformOptions().minSize(-1)));
        assertTrue(negative.getMessage().contains("reform option min_size must be a whole number >= 0, not -1"),
                negative.getMessage());
        IllegalArgumentException fraction = assertThrows(IllegalArgumentException.class,
                () -> cfx.reform(new Conflux.ReformOptions().set("max_size", 2.5)));
        assertTrue(fraction.getMessage().contains("max_size"), fraction.getMessage());
        assertThrows(IllegalArgumentException.class, () -> cfx.reform(null));
        assertThrows(IllegalArgumentException.class, () -> new Conflux.ReformOptions().set(null, 1));
        // checked before anything joins: no other rank is involved
        IllegalArgumentException init = assertThrows(IllegalArgumentException.class,
                () -> Conflux.elasticInit(new Conflux.ReformOptions().set("timeout", 5)));
        assertTrue(init.getMessage().contains("unknown option 'timeout'"), init.getMessage());
    }

    @Test
    void a03_aContextNotMadeByElasticInitCannotReform() {
        ConfluxException e = assertThrows(ConfluxException.class,
                () -> cfx.reform(new Conflux.ReformOptions().minSize(1).timeoutSeconds(5)));
        assertEquals(Status.UNSUPPORTED, e.status());
        assertTrue(e.getMessage().contains("cfx_context_reform"), e.getMessage());
        assertEquals(Status.UNSUPPORTED, assertThrows(ConfluxException.class, cfx::membershipRound).status());
        assertEquals(Status.UNSUPPORTED, assertThrows(ConfluxException.class, cfx::memberId).status());
        assertEquals(Status.UNSUPPORTED, assertThrows(ConfluxException.class, cfx::membershipPending).status());
        // the world is untouched
        assertEquals(size, cfx.size());
        ErrorsTest.assertWorks("after.reform.refused");
    }
}
